package replayd_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/replayd/replayd"
)

// openExampleDB opens a database file in a fresh temporary directory and
// returns a cleanup that closes it and removes the directory.
func openExampleDB() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "replayd-example-")
	if err != nil {
		log.Fatal(err)
	}
	db, err := replayd.OpenDB(filepath.Join(dir, "events.db"))
	if err != nil {
		os.RemoveAll(dir)
		log.Fatal(err)
	}
	return db, func() {
		db.Close()
		os.RemoveAll(dir)
	}
}

// Publish events and read them back from the log, as a reconnecting client
// would: everything visible to its topic after its cursor.
func Example() {
	db, cleanup := openExampleDB()
	defer cleanup()

	hub, err := replayd.New(db, replayd.Options{}) // creates the schema
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()

	ctx := context.Background()
	publish := func(topic string, payload any, opts ...replayd.PublishOption) replayd.Event {
		ev, err := hub.Publish(ctx, topic, payload, opts...)
		if err != nil {
			log.Fatal(err)
		}
		return ev
	}
	// An event's id is its sequence in the log: ids grow with every event,
	// from a first one near the clock in microseconds when the log was
	// first opened (see Store, the sequence floor). This example prints
	// them from the first.
	first := publish("room-1", map[string]string{"text": "hi"}).Sequence
	publish("room-2", map[string]string{"text": "elsewhere"})
	publish("", map[string]string{"text": "to everyone"}, replayd.WithType("notice")) // a broadcast
	publish("room-1", map[string]string{"text": "bye"})

	// A client on room-1 whose last id was the first missed these:
	events, err := hub.Replay(ctx, "room-1", first, 100)
	if err != nil {
		log.Fatal(err)
	}
	for _, ev := range events {
		fmt.Printf("id first+%d  %-7s %q %s\n", ev.Sequence-first, ev.Type, ev.Topic, ev.Payload)
	}
	head, _ := hub.LatestSequence(ctx)
	fmt.Printf("head: first+%d\n", head-first)
	// Output:
	// id first+2  notice  "" {"text":"to everyone"}
	// id first+3  message "room-1" {"text":"bye"}
	// head: first+3
}

// A subscriber sees every event this hub delivers live, of every topic, in
// sequence order. For the hub's own publishes the callback has run by the
// time Publish returns.
func ExampleEventHub_Subscribe() {
	db, cleanup := openExampleDB()
	defer cleanup()
	hub, err := replayd.New(db, replayd.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()
	ctx := context.Background()
	head, _ := hub.LatestSequence(ctx) // ids go on from the head

	unsubscribe := hub.Subscribe(func(ev replayd.Event) {
		// Runs on the delivering goroutine: keep it short, never Publish here.
		fmt.Printf("got id head+%d on %q: %s\n", ev.Sequence-head, ev.Topic, ev.Payload)
	})

	for _, topic := range []string{"orders", ""} {
		if _, err := hub.Publish(ctx, topic, map[string]string{"topic": topic}); err != nil {
			log.Fatal(err)
		}
	}
	unsubscribe()
	if _, err := hub.Publish(ctx, "orders", "not seen"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// got id head+1 on "orders": {"topic":"orders"}
	// got id head+2 on "": {"topic":""}
}

// A subscriber that must not miss anything silently asks to be told about
// holes: rows it cannot be given live, here because retention deleted rows
// another process wrote before this hub delivered them. A gap comes before
// any event that follows it.
func ExampleEventHub_SubscribeWithGaps() {
	db, cleanup := openExampleDB()
	defer cleanup()
	other, err := replayd.New(db, replayd.Options{}) // stands for another process
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()
	hub, err := replayd.New(db, replayd.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()
	ctx := context.Background()
	head, _ := hub.LatestSequence(ctx) // ids go on from the head

	unsubscribe := hub.SubscribeWithGaps(func(ev replayd.Event) {
		fmt.Printf("event head+%d: %s\n", ev.Sequence-head, ev.Payload)
	}, func(g replayd.Gap) {
		// Re-sync from a snapshot, as an SSE client does on a gap frame.
		fmt.Printf("gap %s: head+%d to head+%d missed\n", g.Reason, g.From-head, g.Through-head)
	})
	defer unsubscribe()

	for i := 1; i <= 3; i++ {
		if _, err := other.Publish(ctx, "orders", map[string]int{"i": i}); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := other.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 1}); err != nil {
		log.Fatal(err)
	}
	// hub has no tail: it learns of the other process's rows as it publishes.
	if _, err := hub.Publish(ctx, "orders", map[string]int{"i": 4}); err != nil {
		log.Fatal(err)
	}
	// Output:
	// gap pruned: head+1 to head+2 missed
	// event head+3: {"i":3}
	// event head+4: {"i":4}
}

// Mount the SSE endpoint on your own mux. A client that reconnects with
// Last-Event-ID gets a hello frame carrying its cursor, then what it missed.
func ExampleEventHub_Handler() {
	db, cleanup := openExampleDB()
	defer cleanup()
	hub, err := replayd.New(db, replayd.Options{})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("/events", hub.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer hub.Close() // runs first: ends open streams so srv.Close does not wait

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var ids []string
	for n := 1; n <= 2; n++ {
		ev, err := hub.Publish(ctx, "room-1", map[string]int{"n": n})
		if err != nil {
			log.Fatal(err)
		}
		ids = append(ids, fmt.Sprint(ev.Sequence))
	}
	// Ids are sequences near the clock in microseconds (see Store, the
	// sequence floor): printed below as <first> and <second>.
	names := strings.NewReplacer(ids[0], "<first>", ids[1], "<second>")

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events?topic=room-1", nil)
	req.Header.Set("Last-Event-ID", ids[0])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.Header.Get("Content-Type"))

	// Print the first two frames as they are on the wire.
	r := bufio.NewReader(resp.Body)
	for frames := 0; frames < 2; {
		line, err := r.ReadString('\n')
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(names.Replace(line))
		if strings.TrimSpace(line) == "" {
			frames++
		}
	}
	// Output:
	// text/event-stream; charset=utf-8
	// id: <first>
	// event: hello
	// data: {"topic":"room-1","topics":["room-1"],"cursor":<first>,"head":<second>}
	//
	// id: <second>
	// event: message
	// data: {"n":2}
}

// Retention deletes the oldest events; the head never goes backwards, and a
// client that resumes below what was deleted gets a "pruned" gap.
func ExampleEventHub_Prune() {
	db, cleanup := openExampleDB()
	defer cleanup()
	hub, err := replayd.New(db, replayd.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()

	ctx := context.Background()
	start, _ := hub.LatestSequence(ctx) // ids go on from the head
	for i := 1; i <= 10; i++ {
		if _, err := hub.Publish(ctx, "metrics", map[string]int{"i": i}); err != nil {
			log.Fatal(err)
		}
	}
	deleted, err := hub.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 3})
	if err != nil {
		log.Fatal(err)
	}
	head, _ := hub.LatestSequence(ctx)
	kept, _ := hub.Replay(ctx, "metrics", 0, 100)
	fmt.Println("deleted:", deleted)
	fmt.Printf("head: start+%d\n", head-start)
	for _, ev := range kept {
		fmt.Printf("kept: start+%d %s\n", ev.Sequence-start, ev.Payload)
	}

	// In a server, prune on a schedule instead:
	//
	//	stop := hub.StartRetention(replayd.RetentionPolicy{MaxAge: 24 * time.Hour}, time.Hour)
	//	defer stop()

	// Output:
	// deleted: 7
	// head: start+10
	// kept: start+8 {"i":8}
	// kept: start+9 {"i":9}
	// kept: start+10 {"i":10}
}

// An event id makes a publish safe to retry: a known id stores and delivers
// nothing and returns the original event.
func ExampleWithEventID() {
	db, cleanup := openExampleDB()
	defer cleanup()
	hub, err := replayd.New(db, replayd.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()

	ctx := context.Background()
	var seqs []int64
	for range 2 { // a retry after a timeout, say
		ev, err := hub.Publish(ctx, "orders", map[string]int{"total": 40}, replayd.WithEventID("order-1001-paid"))
		if err != nil {
			log.Fatal(err)
		}
		seqs = append(seqs, ev.Sequence)
	}
	stored, err := hub.Replay(ctx, "orders", 0, 100)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the same sequence:", seqs[0] == seqs[1])
	fmt.Println("stored events:", len(stored))
	// Output:
	// the same sequence: true
	// stored events: 1
}

// Authorize decides who may see what, once per request and before anything
// is read from the log. Here a session cookie names the user; a user may
// see their own topic (user-42) and the rooms they belong to, but not the
// global scope. Returning ErrUnauthenticated answers 401; any other error
// 403. The error's text is never sent to the client.
func ExampleOptions_authorize() {
	db, cleanup := openExampleDB()
	defer cleanup()
	sessions := map[string]string{"s3cr3t": "42"}         // session cookie -> user id
	members := map[string][]string{"room-1": {"42", "7"}} // room -> user ids
	hub, err := replayd.New(db, replayd.Options{
		Authorize: func(r *http.Request, topics []string) error {
			c, err := r.Cookie("session")
			if err != nil {
				return replayd.ErrUnauthenticated
			}
			user, ok := sessions[c.Value]
			if !ok {
				return fmt.Errorf("unknown session: %w", replayd.ErrUnauthenticated)
			}
			if len(topics) == 0 {
				return errors.New("only the global scope's owner may see every topic")
			}
			for _, t := range topics {
				if t != "user-"+user && !slices.Contains(members[t], user) {
					return fmt.Errorf("user %s may not see %q", user, t)
				}
			}
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()
	defer hub.Close() // runs first: ends open streams so srv.Close does not wait

	try := func(query, session string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+query, nil)
		if session != "" {
			req.AddCookie(&http.Cookie{Name: "session", Value: session})
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		line, _ := bufio.NewReader(resp.Body).ReadString('\n') // a refusal's body, or the hello's id
		head, _ := hub.LatestSequence(ctx)
		line = strings.Replace(line, fmt.Sprint(head), "<head>", 1) // ids are sequences near the clock in microseconds
		fmt.Printf("%-28s %d %s\n", query, resp.StatusCode, strings.TrimSpace(line))
	}
	try("?topic=user-42", "")
	try("?topic=user-42", "expired")
	try("?topic=user-42&topic=room-1", "s3cr3t")
	try("?topic=user-7", "s3cr3t")
	try("?topic=room-1&topic=room-2", "s3cr3t")
	try("", "s3cr3t")
	// Output:
	// ?topic=user-42               401 unauthorized
	// ?topic=user-42               401 unauthorized
	// ?topic=user-42&topic=room-1  200 id: <head>
	// ?topic=user-7                403 forbidden
	// ?topic=room-1&topic=room-2   403 forbidden
	//                              403 forbidden
}

// WithRevocation revokes access through a context of the application's: a
// session's here, cancelled on logout. Middleware puts it on each request;
// the stream ends as soon as it is done, detached or not, and the client's
// reconnect goes to Authorize again.
func ExampleWithRevocation() {
	db, cleanup := openExampleDB()
	defer cleanup()
	type sessionKey struct{}
	session, logout := context.WithCancel(context.Background()) // the session of cookie s3cr3t; done: logged out
	defer logout()
	hub, err := replayd.New(db, replayd.Options{
		Authorize: func(r *http.Request, topics []string) error {
			if r.Context().Value(sessionKey{}) == nil {
				return replayd.ErrUnauthenticated
			}
			return nil
		},
		SSE: replayd.SSEOptions{DetachConnections: true},
	})
	if err != nil {
		log.Fatal(err)
	}
	withSession := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c, err := r.Cookie("session"); err == nil && c.Value == "s3cr3t" && session.Err() == nil {
				ctx := context.WithValue(r.Context(), sessionKey{}, c.Value)
				r = r.WithContext(replayd.WithRevocation(ctx, session))
			}
			next.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(withSession(hub.Handler()))
	defer srv.Close()
	defer hub.Close() // runs first: ends open streams so srv.Close does not wait

	open := func() (*http.Response, *bufio.Reader) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"?topic=user-42", nil)
		req.AddCookie(&http.Cookie{Name: "session", Value: "s3cr3t"})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		return resp, bufio.NewReader(resp.Body)
	}
	resp, body := open()
	line, _ := body.ReadString('\n')
	head, _ := hub.LatestSequence(context.Background())
	line = strings.Replace(line, fmt.Sprint(head), "<head>", 1) // ids are sequences near the clock in microseconds
	fmt.Println(resp.StatusCode, strings.TrimSpace(line))

	logout()
	for err == nil {
		_, err = body.ReadString('\n')
	}
	resp.Body.Close()
	fmt.Println("stream ended:", err)
	resp, _ = open()
	resp.Body.Close()
	fmt.Println("reconnect:", resp.StatusCode)
	// Output:
	// 200 id: <head>
	// stream ended: EOF
	// reconnect: 401
}
