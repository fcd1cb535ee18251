package hubtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Request admission (origins, topics, Authorize, the connection cap) over real HTTP: strict topic parsing,
// Options.Authorize's grant, and a request context that ends.

// A query that does not parse is refused: net/url drops a malformed pair,
// so "?topic=a;b" would otherwise be served as a global stream of every
// topic (issue 8, item 6).
func testSSETopicQueryStrict(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{MaxTopics: 3}})
	srv := serve(t, h)
	ab := mustPublish(t, h, "a;b", "a topic Publish accepts")
	mustPublish(t, h, "other", "invisible to a;b")
	for _, q := range []string{"?topic=a;b", "?topic=a%3Bb;x=1", "?topic=a&x=%zz", "?%zz&topic=a", "?topic=a&topic=b&topic=c&topic=d"} {
		status, body := wiretest.Get(t, srv.URL+q, wiretest.LastID(0))
		if status != http.StatusBadRequest {
			t.Errorf("%s: status %d, body %q; want 400", q, status, body)
		}
	}
	if h.Clients().Total() != 0 || len(h.Clients().Snapshot()) != 0 {
		t.Fatalf("a refused request reached the tracker: %+v", h.Clients().Snapshot())
	}

	// The topic, escaped, is served as itself.
	c := wiretest.Dial(t, srv.URL+"?topic="+url.QueryEscape("a;b"), wiretest.LastID(0))
	if _, topic, _, _ := c.Hello(); topic == nil || *topic != "a;b" {
		t.Fatalf("topic %v, want a;b", topic)
	}
	if f := c.Next(); f.ID != fmt.Sprint(ab.Sequence) {
		t.Fatalf("got %+v, want the event of a;b", f)
	}
	c.Close()

	// Blank values are ignored and repeats count once.
	for _, q := range []string{"?topic=&topic=a", "?topic=a&topic=a", "?topic=%20a%20&topic=a&topic="} {
		c := wiretest.Dial(t, srv.URL+q, nil)
		if _, topic, _, _ := c.Hello(); topic == nil || *topic != "a" {
			t.Errorf("%s: topic %v, want a", q, topic)
		}
		c.Close()
	}
	// MaxTopics distinct topics, repeated, are within the limit.
	c = wiretest.Dial(t, srv.URL+"?topic=a&topic=b&topic=c&topic=a&topic=b", nil)
	c.Hello()
}

// Access is revoked by ending the request's context: middleware that ties
// it to a session ends a live stream at once.
func testSSERevokedContextEndsStream(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	var (
		mu       sync.Mutex
		sessions = map[string][]context.CancelFunc{}
	)
	revoke := func(session string) {
		mu.Lock()
		defer mu.Unlock()
		for _, cancel := range sessions[session] {
			cancel()
		}
		delete(sessions, session)
	}
	mw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		mu.Lock()
		s := r.URL.Query().Get("session")
		sessions[s] = append(sessions[s], cancel)
		mu.Unlock()
		h.Handler().ServeHTTP(w, r.WithContext(ctx))
	})
	srv := httptest.NewServer(mw)
	t.Cleanup(srv.Close)

	alice := wiretest.Dial(t, srv.URL+"?topic=room&session=alice", nil)
	bob := wiretest.Dial(t, srv.URL+"?topic=room&session=bob", nil)
	alice.Hello()
	bob.Hello()
	ev := mustPublish(t, h, "room", 1)
	for _, c := range []*wiretest.Client{alice, bob} {
		c.NextIs(ev.Sequence, "got")
	}
	revoke("alice")
	start := time.Now()
	if f, err := alice.NextErr(waitFor); !errors.Is(err, io.EOF) {
		t.Fatalf("after revocation alice got %+v, %v; want the stream to end", f, err)
	}
	t.Logf("stream ended %v after revocation", time.Since(start))
	wiretest.WaitUntil(t, "the revoked stream to leave the tracker", func() bool { return h.Clients().Total() == 1 })
	ev = mustPublish(t, h, "room", 2)
	bob.NextIs(ev.Sequence, "bob got")
}

// Access is revoked through WithRevocation: middleware puts the session's
// context on the request, and cancelling it ends every stream of the
// session at once, and answers its waiting long polls, detached or not
// (TestHubSuite/Detached). The client comes back, Authorize decides again,
// and a new session resumes from its last id. Cancelling a session whose
// streams ended is harmless.
func testSSERevokedSessionEndsStream(t *testing.T, newLog func(t *testing.T) opener) {
	type session struct {
		user   string
		ctx    context.Context
		cancel context.CancelFunc
	}
	type sessionKey struct{}
	var (
		mu        sync.Mutex
		sessions  = map[string]*session{} // by token
		authorize = map[string]int{}      // Authorize's calls, by token
	)
	login := func(token, user string) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		mu.Lock()
		sessions[token] = &session{user: user, ctx: ctx, cancel: cancel}
		mu.Unlock()
	}
	logout := func(token string) {
		mu.Lock()
		s := sessions[token]
		delete(sessions, token)
		mu.Unlock()
		s.cancel()
	}
	authorized := func(token string) int {
		mu.Lock()
		defer mu.Unlock()
		return authorize[token]
	}
	open := newLog(t)
	h := open(replayd.Options{
		SSE: replayd.SSEOptions{HeartbeatInterval: -1},
		Authorize: func(r *http.Request, topics []string) error {
			mu.Lock()
			authorize[r.URL.Query().Get("session")]++
			mu.Unlock()
			if _, ok := r.Context().Value(sessionKey{}).(*session); !ok {
				return replayd.ErrUnauthenticated
			}
			return nil
		},
	})
	withSession := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			s := sessions[r.URL.Query().Get("session")]
			mu.Unlock()
			if s != nil {
				ctx := context.WithValue(r.Context(), sessionKey{}, s)
				r = r.WithContext(replayd.WithRevocation(ctx, s.ctx))
			}
			next.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/events", withSession(h.Handler()))
	mux.Handle("/poll", withSession(h.PollHandler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	login("alice-1", "alice")
	login("bob-1", "bob")

	alice := wiretest.Dial(t, srv.URL+"/events?topic=room&session=alice-1", nil)
	bob := wiretest.Dial(t, srv.URL+"/events?topic=room&session=bob-1", nil)
	alice.Hello()
	bob.Hello()
	ev := mustPublish(t, h, "room", 1)
	for _, c := range []*wiretest.Client{alice, bob} {
		c.NextIs(ev.Sequence, "got")
	}
	poll := wiretest.PollLater(t, srv.URL, fmt.Sprintf("topic=room&cursor=%d&wait=30&session=alice-1", ev.Sequence))
	wiretest.WaitUntil(t, "the long poll to wait", func() bool { return h.Metrics().PollConnections == 1 })

	logout("alice-1")
	start := time.Now()
	if f, err := alice.NextErr(waitFor); !errors.Is(err, io.EOF) {
		t.Fatalf("after revocation alice got %+v, %v; want the stream to end", f, err)
	}
	t.Logf("stream ended %v after revocation", time.Since(start))
	if p := poll(); len(p.Events) != 0 || p.Cursor != ev.Sequence || p.Gap != nil {
		t.Fatalf("the revoked long poll was answered %+v; want no events at cursor %d", p, ev.Sequence)
	}
	t.Logf("long poll answered %v after revocation", time.Since(start))
	wiretest.WaitUntil(t, "the revoked stream to leave the tracker", func() bool { return h.Clients().Total() == 1 })
	wiretest.WaitUntil(t, "the long poll to stop waiting", func() bool { return h.Metrics().PollConnections == 0 })

	// The client comes back: Authorize decides again, and refuses.
	before := authorized("alice-1")
	if _, status := wiretest.DialStatus(t, srv.URL+"/events?topic=room&session=alice-1", wiretest.LastID(ev.Sequence)); status != http.StatusUnauthorized {
		t.Fatalf("reconnect after revocation: status %d, want 401", status)
	}
	if status, _, body := wiretest.GetPoll(t, srv.URL, "topic=room&cursor=1&wait=30&session=alice-1"); status != http.StatusUnauthorized {
		t.Fatalf("poll after revocation: %d %s, want 401", status, body)
	}
	if n := authorized("alice-1") - before; n != 2 {
		t.Fatalf("Authorize was asked %d times after revocation, want 2", n)
	}

	// Bob's stream went on; a new session of alice's resumes from her last id.
	ev2 := mustPublish(t, h, "room", 2)
	bob.NextIs(ev2.Sequence, "bob got")
	login("alice-2", "alice")
	alice = wiretest.Dial(t, srv.URL+"/events?topic=room&session=alice-2", wiretest.LastID(ev.Sequence))
	alice.Hello()
	alice.NextIs(ev2.Sequence, "alice replayed")

	// Revoking a session whose stream already ended is harmless.
	bob.Close()
	wiretest.WaitUntil(t, "bob's stream to leave the tracker", func() bool { return h.Clients().Total() == 1 })
	logout("bob-1")
	ev3 := mustPublish(t, h, "room", 3)
	alice.NextIs(ev3.Sequence, "alice got")
}

// A client granted topic "a" while events flow on a denied topic: nothing
// of the denied topic shows in its replay, its live stream, its gap ranges
// and counts, or its heartbeats.
func testSSEDeniedTopicNeverVisible(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	var hbMu sync.Mutex
	hbTopics := map[string]bool{}
	h := open(replayd.Options{
		Authorize: func(r *http.Request, topics []string) error {
			if len(topics) == 0 || slices.Contains(topics, "secret") {
				return errors.New("denied")
			}
			return nil
		},
		SSE: replayd.SSEOptions{
			ReplayLimit:       3,
			HeartbeatInterval: 10 * time.Millisecond,
			HeartbeatData: func(topic string) any {
				hbMu.Lock()
				hbTopics[topic] = true
				hbMu.Unlock()
				return map[string]string{"topic": topic}
			},
		},
	})
	srv := serve(t, h)
	for _, q := range []string{"", "?topic=secret", "?topic=a&topic=secret", "?topic=secret&topic=a"} {
		if status, _ := wiretest.Get(t, srv.URL+q, nil); status != http.StatusForbidden {
			t.Fatalf("%q: status %d, want 403", q, status)
		}
	}

	visible := map[int64]bool{}
	var all []replayd.Event
	pub := func(topic string, n int) {
		ev := mustPublish(t, h, topic, map[string]any{"topic": topic, "n": n})
		all = append(all, ev)
		if topic != "secret" {
			visible[ev.Sequence] = true
		}
	}
	live := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	live.Hello()
	pattern := []string{"secret", "a", "secret", "secret", "", "secret", "a", "secret", "a", "secret", "a", "secret"}
	for i, topic := range pattern {
		pub(topic, i)
	}
	// Live: exactly the visible events.
	var want []string
	for _, ev := range all {
		if visible[ev.Sequence] {
			want = append(want, fmt.Sprint(ev.Sequence))
		}
	}
	if got := wiretest.FrameIDs(live.Events(len(want))); !slices.Equal(got, want) {
		t.Fatalf("live ids %v, want %v", got, want)
	}
	mustPublish(t, h, "secret", "after")
	sentinel := mustPublish(t, h, "a", "sentinel")
	if f := live.NextNonHeartbeat(); f.ID != fmt.Sprint(sentinel.Sequence) {
		t.Fatalf("live got %+v, want the sentinel", f)
	}
	if f := live.Next(); f.Event != "heartbeat" || !strings.Contains(f.Data, `"topic":"a"`) {
		t.Fatalf("live got %+v, want a heartbeat for a", f)
	}
	live.Close()

	// Replay from 0 past the limit: the gap names only visible events, the
	// count is theirs, and the window holds only them.
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0))
	c.Hello()
	g := wiretest.MustGap(t, c.NextNonHeartbeat())
	vis := slices.Sorted(func(yield func(int64) bool) {
		for s := range visible {
			if !yield(s) {
				return
			}
		}
	})
	vis = append(vis, sentinel.Sequence)
	skipped := vis[:len(vis)-3]
	if g.Reason != "replay_limit" || *g.MissedFrom != skipped[0] || *g.MissedThrough != skipped[len(skipped)-1] || *g.Missed != int64(len(skipped)) {
		t.Fatalf("gap %s, want replay_limit over %v", g.String(), skipped)
	}
	var gotReplay []string
	for _, f := range c.Events(3) {
		gotReplay = append(gotReplay, f.ID)
		if strings.Contains(f.Data, "secret") {
			t.Fatalf("replayed a denied event: %+v", f)
		}
	}
	var wantReplay []string
	for _, s := range vis[len(vis)-3:] {
		wantReplay = append(wantReplay, fmt.Sprint(s))
	}
	if !slices.Equal(gotReplay, wantReplay) {
		t.Fatalf("replayed %v, want %v", gotReplay, wantReplay)
	}
	c.Close()

	// Rows of the denied topic pruned above the cursor are not the
	// client's business: it resumes cleanly, without a pruned gap.
	cursor := mustPublish(t, h, "a", "cursor").Sequence
	mustPublish(t, h, "secret", "pruned 1")
	through := mustPublish(t, h, "secret", "pruned 2").Sequence
	after := mustPublish(t, h, "a", "after the prune")
	// Retention deletes every event up to through (by count: on every
	// store, without waiting for the clock): the pattern's, the two before
	// the sentinel's check and the three above.
	if n, err := h.Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 1}); err != nil || n != int64(len(all))+5 {
		t.Fatalf("pruned %d, %v; want every event up to %d", n, err, through)
	}
	c = wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(cursor))
	c.Hello()
	if f := c.NextNonHeartbeat(); f.ID != fmt.Sprint(after.Sequence) {
		t.Fatalf("after pruning the denied topic above the cursor, the resume got %+v, want %d", f, after.Sequence)
	}
	hbMu.Lock()
	defer hbMu.Unlock()
	if len(hbTopics) != 1 || !hbTopics["a"] {
		t.Fatalf("HeartbeatData called for %v, want only a", hbTopics)
	}
}

// A request whose access is revoked before it is served gets no event, on
// either transport (issue 17): revoked before it arrived (its revocation
// context already done) or while it was admitted (here: inside
// Authorize, after the middleware put the revocation on it). An SSE
// stream ends before its hello, a 200 text/event-stream holding a comment
// only, on both paths (TestHubSuite/Detached); a poll, immediate or long,
// gets 403 and no answer. Each is counted as refused "forbidden". Many
// times over: the revocation watch runs on another goroutine, and it used
// to race the handshake, the hello and the replay.
func testRevokedBeforeServedGetsNothing(t *testing.T, newLog func(t *testing.T) opener) {
	rounds := 200
	if testing.Short() {
		rounds = 20
	}
	type revokeKey struct{}
	open := newLog(t)
	h := open(replayd.Options{
		SSE: replayd.SSEOptions{HeartbeatInterval: -1},
		Authorize: func(r *http.Request, _ []string) error {
			if revoke, ok := r.Context().Value(revokeKey{}).(context.CancelFunc); ok {
				revoke()
			}
			return nil
		},
	})
	// ?revoke=before: the revocation is done when the request arrives;
	// ?revoke=admitted: Authorize revokes it.
	mux := http.NewServeMux()
	withRevocation := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			revoked, revoke := context.WithCancel(context.Background())
			ctx := r.Context()
			if r.URL.Query().Get("revoke") == "before" {
				revoke()
			} else {
				ctx = context.WithValue(ctx, revokeKey{}, revoke)
			}
			next.ServeHTTP(w, r.WithContext(replayd.WithRevocation(ctx, revoked)))
		})
	}
	mux.Handle("/events", withRevocation(h.Handler()))
	mux.Handle("/poll", withRevocation(h.PollHandler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	var head int64
	for i := range 30 {
		head = mustPublish(t, h, "room", i).Sequence
	}

	requests := 0
	for _, when := range []string{"before", "admitted"} {
		// SSE, resuming from 0: a hello and 30 events if it were served.
		streams, framed, frames := 0, 0, 0
		for range rounds {
			c, status := wiretest.DialStatus(t, srv.URL+"/events?topic=room&revoke="+when, wiretest.LastID(0))
			if status != http.StatusOK {
				t.Fatalf("revoked %s: status %d, want 200 (a stream that ends)", when, status)
			}
			if ct := c.Response().Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("revoked %s: Content-Type %q: an EventSource would not reconnect", when, ct)
			}
			n := len(c.Rest())
			c.Close()
			streams++
			frames += n
			if n > 0 {
				framed++
			}
		}
		requests += streams
		if framed > 0 {
			t.Errorf("SSE revoked %s: %d of %d streams got frames (%d frames: hello and replay); want none",
				when, framed, streams, frames)
		}

		// Polls: immediate and long, with events to answer or without.
		for _, q := range []string{"cursor=0", "", "cursor=0&wait=5", fmt.Sprintf("cursor=%d&wait=5", head)} {
			answered, events := 0, 0
			for range rounds {
				status, _, body := wiretest.GetPoll(t, srv.URL, "topic=room&revoke="+when+"&"+q)
				if status == http.StatusOK {
					answered++
					var p wiretest.PollAnswer
					if err := json.Unmarshal(body, &p); err != nil {
						t.Fatalf("poll %q: %v: %s", q, err, body)
					}
					events += len(p.Events)
				} else if status != http.StatusForbidden {
					t.Fatalf("poll %q revoked %s: status %d %s, want 403", q, when, status, body)
				}
			}
			requests += rounds
			if answered > 0 {
				t.Errorf("poll %q revoked %s: %d of %d answered 200 (%d events); want 403", q, when, answered, rounds, events)
			}
		}
	}
	wiretest.WaitUntil(t, "no stream or poll left", func() bool {
		m := h.Metrics()
		return h.Clients().Total() == 0 && m.SSEConnections == 0 && m.PollConnections == 0
	})
	if m := h.Metrics(); m.RefusedForbidden != uint64(requests) {
		t.Errorf("%d requests refused forbidden, want every one of %d", m.RefusedForbidden, requests)
	}
}
