package replaydpg

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx" driver
	"github.com/replayd/replayd"
)

// appTable creates the application's own table prefix+"orders" and drops
// it when the test ends.
func appTable(t testing.TB, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	table := prefix + "orders"
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (id bigint PRIMARY KEY, status text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return table
}

// tailingHub is a hub on s tailing the log (an hour's fallback poll: only
// NOTIFY wakes it), served over SSE by an httptest server.
func tailingHub(t testing.TB, s *Store) (*replayd.EventHub, string) {
	t.Helper()
	h, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := h.StartTail(time.Hour, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		stop()
		h.Close()
	})
	return h, srv.URL
}

// sseFrames connects to an SSE endpoint (Last-Event-ID lastID, if not
// empty) and returns its frames; the stream ends with the test.
func sseFrames(t testing.TB, ctx context.Context, url, lastID string) <-chan sseFrame {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	out := make(chan sseFrame, 256)
	go func() {
		defer resp.Body.Close()
		readSSE(resp.Body, out)
	}()
	return out
}

// framesUntil reads frames (after the hello) until one carries the event
// id want in its data's "id" field, and returns the message frames read;
// it fails on any other frame type, a gap first of all.
func framesUntil(t testing.TB, frames <-chan sseFrame, want string, within time.Duration) []sseFrame {
	t.Helper()
	var got []sseFrame
	deadline := time.After(within)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				t.Fatalf("stream ended after %v, before %s", got, want)
			}
			switch f.event {
			case "hello":
				continue
			case "message":
			default:
				t.Fatalf("a %q frame (%s) before %s; messages so far %v", f.event, f.data, want, got)
			}
			got = append(got, f)
			var p struct{ ID string }
			if json.Unmarshal([]byte(f.data), &p) == nil && p.ID == want {
				return got
			}
		case <-deadline:
			t.Fatalf("%s not delivered within %v; got %v", want, within, got)
		}
	}
}

// TestPublishTxTwoNodes: an event published in the application's
// transaction is delivered, once, to SSE clients of two hubs on two
// stores (two nodes) after the commit, with no further call; a rolled
// back one leaves no row, no delivery and no gap frame.
func TestPublishTxTwoNodes(t *testing.T) {
	t.Parallel()
	a, prefix := openTestStore(t)
	b := openPrefix(t, prefix)
	ctx := testCtx(t, time.Minute)
	pool := testPool(t)
	orders := appTable(t, pool, prefix)
	_, urlA := tailingHub(t, a)
	_, urlB := tailingHub(t, b)
	clients := []<-chan sseFrame{sseFrames(t, ctx, urlA, ""), sseFrames(t, ctx, urlB, "")}
	for _, c := range clients { // the hello: the stream is live
		if f := <-c; f.event != "hello" {
			t.Fatalf("first frame %+v", f)
		}
	}

	ship := func(id int64, commit bool, publish func(tx pgx.Tx) (replayd.Event, error)) replayd.Event {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id, status) VALUES ($1, 'shipped')`, id); err != nil {
			t.Fatal(err)
		}
		ev, err := publish(tx)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return ev
	}
	payload := func(id int64) map[string]any { return map[string]any{"id": fmt.Sprint("order-", id), "status": "shipped"} }
	ev42 := ship(42, true, func(tx pgx.Tx) (replayd.Event, error) { return a.PublishTx(ctx, tx, "orders", payload(42)) })
	if ev42.Sequence != 0 || ev42.EventID == "" || ev42.Type != "message" || ev42.Topic != "orders" || string(ev42.Payload) != `{"id":"order-42","status":"shipped"}` {
		t.Fatalf("PublishTx returned %+v", ev42)
	}
	ship(43, false, func(tx pgx.Tx) (replayd.Event, error) {
		return b.PublishTx(ctx, tx, "orders", payload(43), replayd.WithType("shipped"))
	})
	ship(44, true, func(tx pgx.Tx) (replayd.Event, error) { return b.PublishTx(ctx, tx, "", payload(44)) })
	for i, c := range clients {
		got := framesUntil(t, c, "order-44", 10*time.Second)
		if len(got) != 2 || got[0].data != `{"id":"order-42","status":"shipped"}` {
			t.Fatalf("client of node %d got %v, want order-42 then order-44", i, got)
		}
	}
	// The log: 42 and 44, once each; the outbox empty; 43 nowhere.
	var rows []string
	for _, e := range allEvents(t, a) {
		rows = append(rows, string(e.Payload))
	}
	if fmt.Sprint(rows) != fmt.Sprint([]string{`{"id":"order-42","status":"shipped"}`, `{"id":"order-44","status":"shipped"}`}) {
		t.Fatalf("log %v", rows)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("outbox holds %d rows (%v)", n, err)
	}
	// Nothing more arrives: not 43, not a gap.
	for i, c := range clients {
		select {
		case f := <-c:
			t.Fatalf("client of node %d: a further frame %+v", i, f)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// TestPublishTxRetries: idempotency by event id across PublishTx,
// PublishSQLTx and the hub's Publish, whichever stores first, including a
// Publish that stores the id while the outbox still holds it.
func TestPublishTxRetries(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	ctx := testCtx(t, time.Minute)
	pool := testPool(t)
	h, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	db, err := sql.Open("pgx", testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	inTx := func(publish func(tx pgx.Tx) (replayd.Event, error)) replayd.Event {
		t.Helper()
		var ev replayd.Event
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			ev, err = publish(tx)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	inSQLTx := func(commit bool, opts ...replayd.PublishOption) replayd.Event {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := s.PublishSQLTx(ctx, tx, "t", map[string]int{"n": 1}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	// stored waits until the log holds event id and returns it.
	stored := func(id string) replayd.Event {
		t.Helper()
		for {
			head, err := s.Head(ctx) // before the look-up: a relay after it wakes the wait
			if err != nil {
				t.Fatal(err)
			}
			var seq int64
			err = pool.QueryRow(ctx, `SELECT sequence FROM `+prefix+`events WHERE event_id = $1`, id).Scan(&seq)
			if err == nil {
				return readSeq(t, s, seq)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
			if err := s.WaitForAppend(ctx, head); err != nil {
				t.Fatalf("%s never reached the log: %v", id, err)
			}
		}
	}
	count := func(id string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`events WHERE event_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// PublishTx first; then Publish, PublishTx and PublishSQLTx retries.
	inTx(func(tx pgx.Tx) (replayd.Event, error) {
		return s.PublishTx(ctx, tx, "t", map[string]int{"n": 1}, replayd.WithEventID("r1"))
	})
	orig := stored("r1")
	if ev, err := h.Publish(ctx, "t", map[string]int{"n": 2}, replayd.WithEventID("r1")); err != nil || ev.Sequence != orig.Sequence || string(ev.Payload) != `{"n":1}` {
		t.Fatalf("Publish retry: %+v, %v; want the original %+v", ev, err, orig)
	}
	if ev := inTx(func(tx pgx.Tx) (replayd.Event, error) {
		return s.PublishTx(ctx, tx, "t", map[string]int{"n": 3}, replayd.WithEventID("r1"))
	}); ev.Sequence != orig.Sequence || string(ev.Payload) != `{"n":1}` || !ev.CreatedAt.Equal(orig.CreatedAt) {
		t.Fatalf("PublishTx retry returned %+v, want the original %+v", ev, orig)
	}
	if ev := inSQLTx(true, replayd.WithEventID("r1")); ev.Sequence != orig.Sequence {
		t.Fatalf("PublishSQLTx retry returned %+v, want the original %+v", ev, orig)
	}

	// Publish first; then PublishTx returns it and stores nothing.
	first, err := h.Publish(ctx, "t", 5, replayd.WithEventID("r2"))
	if err != nil {
		t.Fatal(err)
	}
	if ev := inTx(func(tx pgx.Tx) (replayd.Event, error) { return s.PublishTx(ctx, tx, "t", 6, replayd.WithEventID("r2")) }); ev.Sequence != first.Sequence {
		t.Fatalf("PublishTx after Publish: %+v, want %+v", ev, first)
	}

	// While the outbox holds r3 (every relay held off by the relay's
	// advisory lock), Publish stores it; the relay then stores nothing.
	lock, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, "replayd relay "+prefix); err != nil {
		t.Fatal(err)
	}
	inTx(func(tx pgx.Tx) (replayd.Event, error) { return s.PublishTx(ctx, tx, "t", 7, replayd.WithEventID("r3")) })
	inTx(func(tx pgx.Tx) (replayd.Event, error) { return s.PublishTx(ctx, tx, "t", 7, replayd.WithEventID("r3")) }) // twice in the outbox
	inSQLTx(true, replayd.WithEventID("r4"))
	inSQLTx(false, replayd.WithEventID("r5")) // rolled back
	pub, err := h.Publish(ctx, "t", 7, replayd.WithEventID("r3"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, "replayd relay "+prefix); err != nil {
		t.Fatal(err)
	}
	if ev := stored("r4"); ev.Sequence <= pub.Sequence {
		t.Fatalf("r4 at %d, below Publish's r3 at %d", ev.Sequence, pub.Sequence)
	}
	waitOutboxEmpty(t, ctx, pool, prefix)
	if ev := stored("r3"); ev.Sequence != pub.Sequence {
		t.Fatalf("r3 at %d, Publish returned %d", ev.Sequence, pub.Sequence)
	}
	for _, id := range []string{"r1", "r2", "r3", "r4"} {
		if n := count(id); n != 1 {
			t.Fatalf("%d rows of %s", n, id)
		}
	}
	if n := count("r5"); n != 0 {
		t.Fatalf("the rolled back r5 is in the log")
	}

	// Bad input is Publish's ErrInvalid, and the transaction goes on.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, bad := range []func() error{
			func() error { _, err := s.PublishTx(ctx, tx, " t", 1); return err },
			func() error { _, err := s.PublishTx(ctx, tx, "t", json.RawMessage(`{`)); return err },
			func() error { _, err := s.PublishTx(ctx, tx, "t", 1, replayd.WithEventID("a\nb")); return err },
			func() error { _, err := s.PublishTx(ctx, tx, "t", json.RawMessage("\"\xff\"")); return err },
		} {
			if err := bad(); !errors.Is(err, replayd.ErrInvalid) {
				t.Errorf("bad input: %v, want ErrInvalid", err)
			}
		}
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	if err != nil {
		t.Fatalf("the transaction after refused input: %v", err)
	}
}

// readSeq reads the event at seq.
func readSeq(t testing.TB, s *Store, seq int64) replayd.Event {
	t.Helper()
	evs, err := s.ReadAfter(context.Background(), seq-1, 1)
	if err != nil || len(evs) != 1 || evs[0].Sequence != seq {
		t.Fatalf("read %d: %v, %v", seq, evs, err)
	}
	return evs[0]
}

// waitOutboxEmpty waits, within ctx, until the outbox of prefix is empty.
func waitOutboxEmpty(t testing.TB, ctx context.Context, pool *pgxpool.Pool, prefix string) {
	t.Helper()
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`outbox`).Scan(&n); err != nil {
			t.Fatalf("the outbox: %v", err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the outbox still holds %d rows", n)
		case <-time.After(10 * time.Millisecond): // no signal for "relayed": poll
		}
	}
}

var _ = strconv.Itoa
