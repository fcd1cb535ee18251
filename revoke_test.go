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

// A revocation already done when the stream starts ends it at once.
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
				endsAfter(t, wiretest.Dial(t, srv.URL+"?topic=a", nil), "hello")
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
