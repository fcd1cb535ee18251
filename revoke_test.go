package replayd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/storage"
)

// watchedCtx is a revocation context that counts who watches it: the
// context package registers a context.AfterFunc through its AfterFunc
// method. A registration counts until it has run or been stopped, so a
// count above zero once every stream ended is one left behind.
type watchedCtx struct {
	context.Context
	cancel  context.CancelFunc
	watched atomic.Int64
}

func newWatchedCtx(t *testing.T) *watchedCtx {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &watchedCtx{Context: ctx, cancel: cancel}
}

// Value hides the cancelCtx under c, which the context package would
// otherwise register with directly.
func (c *watchedCtx) Value(any) any { return nil }

func (c *watchedCtx) AfterFunc(f func()) (stop func() bool) {
	c.watched.Add(1)
	var once sync.Once
	done := func() { once.Do(func() { c.watched.Add(-1) }) }
	s := context.AfterFunc(c.Context, func() {
		done()
		f()
	})
	return func() bool {
		stopped := s()
		done()
		return stopped
	}
}

// A stream watches its request's revocations (WithRevocation, here two:
// a session's and a room membership's) while it runs and unregisters when
// it ends, whether its client left or a revocation ended it, attached or
// detached; so does a waiting long poll while it waits. Cancelling a
// revocation nothing watches any more is harmless.
func TestSSERevokeWatchUnregisters(t *testing.T) {
	t.Run("attached", testRevocationUnregistered)
	t.Run("detached", func(t *testing.T) { withDetach(t, testRevocationUnregistered) })
}

func testRevocationUnregistered(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{HeartbeatInterval: 50 * time.Millisecond}})
	session, room := newWatchedCtx(t), newWatchedCtx(t)
	mux := http.NewServeMux()
	revocable := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := WithRevocation(WithRevocation(r.Context(), session), room)
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	mux.Handle("/events", revocable(h.Handler()))
	mux.Handle("/poll", revocable(h.PollHandler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	watching := func(n int64) func() bool {
		return func() bool { return session.watched.Load() == n && room.watched.Load() == n }
	}

	var cs []*wiretest.Client
	for range 3 {
		c := wiretest.Dial(t, srv.URL+"/events?topic=room", nil)
		c.Hello()
		cs = append(cs, c)
	}
	poll := wiretest.PollLater(t, srv.URL, "topic=room&cursor=0&wait=30")
	wiretest.WaitUntil(t, "3 streams and a long poll to watch both revocations", watching(4))

	// A client that leaves unregisters its stream.
	cs[0].Close()
	wiretest.WaitUntil(t, "the stream the client left to unregister", watching(3))

	// One revocation ends the rest; each unregisters from both.
	room.cancel()
	for _, c := range cs[1:] {
		endsAfter(t, c, "heartbeat")
	}
	if p := poll(); len(p.Events) != 0 || p.Cursor != 0 {
		t.Fatalf("revoked long poll answered %+v", p)
	}
	wiretest.WaitUntil(t, "every stream and the poll to unregister", watching(0))
	wiretest.WaitUntil(t, "the streams to leave the tracker", func() bool { return h.Clients().Total() == 0 })
	session.cancel() // watched by nothing
	if n := h.Metrics().PollConnections; n != 0 {
		t.Fatalf("%d polls waiting", n)
	}
}

// A revocation already done when the stream starts ends it at once, before
// its hello (TestRevokedDuringSetupGetsNothingAfter and the suite's
// RevokedBeforeServedGetsNothing do it many times over).
func TestSSERevokedBeforeStart(t *testing.T) {
	for _, detach := range []bool{false, true} {
		t.Run(fmt.Sprintf("detach=%v", detach), func(t *testing.T) {
			body := func(t *testing.T) {
				db, _ := openTestDB(t)
				h := newTestHub(t, db, Options{SSE: SSEOptions{HeartbeatInterval: -1}})
				revoked, cancel := context.WithCancel(context.Background())
				cancel()
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					h.Handler().ServeHTTP(w, r.WithContext(WithRevocation(r.Context(), revoked)))
				}))
				t.Cleanup(srv.Close)
				mustPublish(t, h, "a", 1)
				if fs := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0)).Rest(); len(fs) != 0 {
					t.Fatalf("a revoked stream got %+v; want it to end before its hello", fs)
				}
				wiretest.WaitUntil(t, "the stream to leave the tracker", func() bool { return h.Clients().Total() == 0 })
			}
			if detach {
				withDetach(t, body)
			} else {
				body(t)
			}
		})
	}
}

// endsAfter fails the test unless c's stream ends within waitFor, after
// nothing but frames of the event type allowed.
func endsAfter(t *testing.T, c *wiretest.Client, allowed string) {
	t.Helper()
	for {
		f, err := c.NextErr(waitFor)
		switch {
		case errors.Is(err, io.EOF):
			return
		case err != nil || f.Event != allowed:
			t.Fatalf("got %+v, %v; want the stream to end, after only %s frames", f, err, allowed)
		}
	}
}

// readHookKey carries, on a request's context, a function that
// revokingStore calls inside each log read made for the request, with the
// Store method and how many reads of that method the request made before.
type readHookKey struct{}

// revokingStore is a Store that calls its requests' read hooks (readHookKey)
// before reading: a test revokes a request's access from inside a chosen
// read, as a revocation racing the handshake or the replay would.
type revokingStore struct{ Store }

type readHook struct {
	mu    sync.Mutex
	calls map[string]int
	fn    func(method string, n int)
}

func (s revokingStore) hook(ctx context.Context, method string) {
	rh, ok := ctx.Value(readHookKey{}).(*readHook)
	if !ok {
		return
	}
	rh.mu.Lock()
	n := rh.calls[method]
	rh.calls[method]++
	rh.mu.Unlock()
	rh.fn(method, n)
}

func (s revokingStore) Head(ctx context.Context) (int64, error) {
	s.hook(ctx, "Head")
	return s.Store.Head(ctx)
}

func (s revokingStore) Window(ctx context.Context, scope []string, cursor int64, limit int) (storage.Window, error) {
	s.hook(ctx, "Window")
	return s.Store.Window(ctx, scope, cursor, limit)
}

func (s revokingStore) Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error) {
	s.hook(ctx, "Read")
	return s.Store.Read(ctx, req)
}

// A request revoked while it is set up, inside the log read of its
// handshake or of a replay page, gets no event read after the revocation
// (issue 17): a stream revoked in its handshake read ends before its
// hello; one revoked in a replay page's read gets the pages written before
// and nothing more; a poll revoked in its read is refused with 403; a long
// poll revoked in the read after its wake is answered with no events, as
// if its wait had run out. Many times over, on both SSE paths: the
// revocation watch runs on another goroutine.
func TestRevokedDuringSetupGetsNothingAfter(t *testing.T) {
	t.Run("attached", func(t *testing.T) { testRevokedDuringSetup(t, true) })
	t.Run("detached", func(t *testing.T) { withDetach(t, func(t *testing.T) { testRevokedDuringSetup(t, false) }) })
}

// testRevokedDuringSetup runs TestRevokedDuringSetupGetsNothingAfter's SSE
// cases, and with polls its poll cases too.
func testRevokedDuringSetup(t *testing.T, polls bool) {
	rounds := 200
	if testing.Short() {
		rounds = 20
	}
	s, _ := openStore(t)
	h, err := NewWithStore(revokingStore{s}, Options{SSE: SSEOptions{HeartbeatInterval: -1, ReplayLimit: 1000, DetachConnections: testDetach}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	// ?method=M&call=N: the request's access is revoked inside its read of
	// Store method M numbered N (from 0).
	mw := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			revoked, revoke := context.WithCancel(context.Background())
			method, call := r.URL.Query().Get("method"), r.URL.Query().Get("call")
			rh := &readHook{calls: map[string]int{}, fn: func(m string, n int) {
				if m == method && fmt.Sprint(n) == call {
					revoke()
				}
			}}
			ctx := context.WithValue(r.Context(), readHookKey{}, rh)
			next.ServeHTTP(w, r.WithContext(WithRevocation(ctx, revoked)))
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/events", mw(h.Handler()))
	mux.Handle("/poll", mw(h.PollHandler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for i := range 2*replayPageEvents - 1 {
		mustPublish(t, h, "room", i)
	}

	for _, tc := range []struct {
		name   string
		query  string
		header http.Header
		before int // event frames written before the revocation
		hello  bool
	}{
		{"fresh, in Head", "method=Head&call=0", nil, 0, false},
		{"resume, in Window", "method=Window&call=0", wiretest.LastID(0), 0, false},
		{"resume, in the first page", "method=Read&call=0", wiretest.LastID(0), 0, true},
		{"resume, in the second page", "method=Read&call=1", wiretest.LastID(0), replayPageEvents, true},
	} {
		late, lateStreams := 0, 0
		for range rounds {
			fs := wiretest.Dial(t, srv.URL+"/events?topic=room&"+tc.query, tc.header).Rest()
			if tc.hello {
				if len(fs) == 0 || fs[0].Event != "hello" {
					t.Fatalf("%s: got %+v, want the hello first", tc.name, fs)
				}
				fs = fs[1:]
			}
			if len(fs) < tc.before {
				t.Fatalf("%s: got %d events, want the %d written before the revocation", tc.name, len(fs), tc.before)
			}
			if n := len(fs) - tc.before; n > 0 {
				late += n
				lateStreams++
			}
		}
		if late > 0 {
			t.Errorf("SSE revoked %s: %d of %d streams got %d frames after the revocation; want none",
				tc.name, lateStreams, rounds, late)
		}
	}
	wiretest.WaitUntil(t, "no stream left", func() bool { return h.Clients().Total() == 0 })

	if !polls {
		return
	}
	for _, q := range []string{"cursor=0", "cursor=0&wait=5"} {
		answered := 0
		for range rounds {
			status, _, body := wiretest.GetPoll(t, srv.URL, "topic=room&method=Read&call=0&"+q)
			switch status {
			case http.StatusOK:
				answered++
			case http.StatusForbidden:
			default:
				t.Fatalf("poll %q: status %d %s", q, status, body)
			}
		}
		if answered > 0 {
			t.Errorf("poll %q revoked in its read: %d of %d answered 200; want 403", q, answered, rounds)
		}
	}

	// A long poll at the head waits; an event wakes it, and its access is
	// revoked in the read that follows.
	woken := 0
	for range rounds / 4 {
		cursor, err := h.store.Head(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		answer := wiretest.PollLater(t, srv.URL, fmt.Sprintf("topic=room&method=Read&call=1&cursor=%d&wait=5", cursor))
		wiretest.WaitUntil(t, "the long poll to wait", func() bool { return h.Metrics().PollConnections == 1 })
		mustPublish(t, h, "room", "wake")
		if p := answer(); len(p.Events) != 0 || p.Cursor != cursor {
			woken++
		}
		wiretest.WaitUntil(t, "the long poll to end", func() bool { return h.Metrics().PollConnections == 0 })
	}
	if woken > 0 {
		t.Errorf("long poll revoked in the read after its wake: %d of %d answered with events; want none", woken, rounds/4)
	}
}
