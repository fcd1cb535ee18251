package client_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
)

var transports = []client.Transport{client.SSE, client.Poll, client.Auto}

// Every event of the scope, from the beginning, then live, once and in
// order, with its type and data; over each transport.
func TestTransports(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			var want []replayd.Event
			want = append(want, s.publish(5, "a")...)
			s.publish(3, "b")
			want = append(want, s.publish(2, "")...)
			c := client.New(s.options(tr, "a"))
			r := newRecorder()
			stop := run(t, c, r)
			r.waitFor(t, want[len(want)-1].Sequence)
			want = append(want, s.publish(4, "a")...)
			s.publish(2, "b")
			want = append(want, s.publish(1, "")...)
			r.waitFor(t, want[len(want)-1].Sequence)
			if err := stop(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v, want context.Canceled", err)
			}
			r.check(t, want, 0)
			if n := len(r.msgs); n != len(want) {
				t.Fatalf("%d messages, want %d: %s", n, len(want), r)
			}
			if got := c.Cursor(); got != want[len(want)-1].Sequence {
				t.Fatalf("Cursor %d, want %d", got, want[len(want)-1].Sequence)
			}
			if tr == client.Poll && (!r.msgs[0].Event.HasTopic || r.msgs[0].Event.Topic != "a" || r.msgs[len(r.msgs)-1].Event.Topic != "") {
				t.Fatalf("poll events lack their topics: %+v", r.msgs[0].Event)
			}
		})
	}
}

// Several topics, and the global scope.
func TestScopes(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			a := s.publish(3, "a")
			s.publish(3, "b")
			cc := s.publish(3, "c")
			all := client.New(s.options(tr))
			ac := client.New(s.options(tr, "a", "c"))
			ra, rac := newRecorder(), newRecorder()
			run(t, all, ra)
			run(t, ac, rac)
			ra.waitFor(t, cc[2].Sequence)
			rac.waitFor(t, cc[2].Sequence)
			if len(ra.msgs) != 9 || len(rac.msgs) != 6 {
				t.Fatalf("global got %s; a+c got %s", ra, rac)
			}
			rac.check(t, append(a, cc...), 0)
		})
	}
}

// FromHead skips what was published before the first connection; the
// cursor is the head once connected, before any event.
func TestFromHead(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			old := s.publish(3, "a")
			opts := s.options(tr, "a")
			opts.Cursor = client.FromHead
			c := client.New(opts)
			if c.Cursor() != client.FromHead {
				t.Fatalf("Cursor before Run: %d", c.Cursor())
			}
			r := newRecorder()
			run(t, c, r)
			wiretest.WaitUntil(t, "the cursor at the head", func() bool { return c.Cursor() == old[2].Sequence })
			fresh := s.publish(2, "a")
			r.waitFor(t, fresh[1].Sequence)
			if len(r.msgs) != 2 {
				t.Fatalf("got %s, want only the 2 new events", r)
			}
			r.check(t, fresh, old[2].Sequence)
		})
	}
}

// A cursor given in Options: only what follows it.
func TestResumeFromCursor(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			evs := s.publish(6, "a")
			opts := s.options(tr, "a")
			opts.Cursor = evs[2].Sequence
			r := newRecorder()
			run(t, client.New(opts), r)
			r.waitFor(t, evs[5].Sequence)
			if len(r.msgs) != 3 {
				t.Fatalf("got %s, want 3 events", r)
			}
			r.check(t, evs, evs[2].Sequence)
		})
	}
}

// A 1 MiB event arrives whole, over either transport.
func TestLargeEvent(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			big := `"` + strings.Repeat("x", 1<<20-2) + `"`
			ev, err := s.hub.Load().Publish(context.Background(), "a", []byte(big))
			if err != nil {
				t.Fatal(err)
			}
			r := newRecorder()
			run(t, client.New(s.options(tr, "a")), r)
			r.waitFor(t, ev.Sequence)
			if got := r.msgs[0].Event.Data; string(got) != big {
				t.Fatalf("data of %d bytes, want %d", len(got), len(big))
			}
		})
	}
}

// The handler's error ends Run and is returned; the cursor stays before
// the refused event, and the next Run hands it again.
func TestHandlerError(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			evs := s.publish(4, "a")
			c := client.New(s.options(tr, "a"))
			boom := errors.New("boom")
			var ids []int64
			err := c.Run(context.Background(), func(m client.Message) error {
				if m.Event.ID == evs[2].Sequence {
					return boom
				}
				ids = append(ids, m.Event.ID)
				return nil
			})
			if !errors.Is(err, boom) {
				t.Fatalf("Run: %v, want the handler's error", err)
			}
			if c.Cursor() != evs[1].Sequence {
				t.Fatalf("Cursor %d, want %d", c.Cursor(), evs[1].Sequence)
			}
			ctx, cancel := context.WithTimeout(context.Background(), wiretest.WaitFor)
			defer cancel()
			err = c.Run(ctx, func(m client.Message) error {
				ids = append(ids, m.Event.ID)
				if m.Event.ID == evs[3].Sequence {
					return boom
				}
				return nil
			})
			if !errors.Is(err, boom) {
				t.Fatalf("second Run: %v", err)
			}
			want := []int64{evs[0].Sequence, evs[1].Sequence, evs[2].Sequence, evs[3].Sequence}
			if len(ids) != 4 || ids[2] != want[2] || ids[3] != want[3] {
				t.Fatalf("ids %v, want %v", ids, want)
			}
		})
	}
}

// 401 and 403 end Run with a *StatusError; the Header hook is called on
// every request and can carry a fresh token.
func TestAuth(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{Authorize: func(r *http.Request, topics []string) error {
				switch r.Header.Get("Authorization") {
				case "Bearer good":
					return nil
				case "":
					return replayd.ErrUnauthenticated
				}
				return errors.New("no")
			}})
			evs := s.publish(2, "a")
			for _, tc := range []struct {
				token string
				code  int
			}{{"", 401}, {"bad", 403}} {
				opts := s.options(tr, "a")
				opts.Header = func(ctx context.Context, h http.Header) error {
					if tc.token != "" {
						h.Set("Authorization", "Bearer "+tc.token)
					}
					return nil
				}
				ctx, cancel := context.WithTimeout(context.Background(), wiretest.WaitFor)
				err := client.New(opts).Run(ctx, func(client.Message) error { return nil })
				cancel()
				var se *client.StatusError
				if !errors.As(err, &se) || se.StatusCode != tc.code {
					t.Fatalf("token %q: Run: %v, want a StatusError %d", tc.token, err, tc.code)
				}
			}
			calls := 0
			opts := s.options(tr, "a")
			opts.Header = func(ctx context.Context, h http.Header) error {
				calls++
				h.Set("Authorization", "Bearer good")
				return nil
			}
			r := newRecorder()
			stop := run(t, client.New(opts), r)
			r.waitFor(t, evs[1].Sequence)
			s.restart() // a reconnect: the hook again
			more := s.publish(1, "a")
			r.waitFor(t, more[0].Sequence)
			stop()
			if calls < 2 {
				t.Fatalf("Header called %d times, want one per request", calls)
			}
			// The hook's error ends Run.
			hookErr := errors.New("no token")
			opts.Header = func(context.Context, http.Header) error { return hookErr }
			if err := client.New(opts).Run(context.Background(), r.handle); !errors.Is(err, hookErr) {
				t.Fatalf("Run: %v, want the hook's error", err)
			}
		})
	}
}

// Cancelling the context returns Run at once, whether it reads a stream,
// waits in a long poll or sleeps before a reconnect; goleak (TestMain)
// checks that nothing is left.
func TestCancel(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			evs := s.publish(1, "a")
			r := newRecorder()
			stop := run(t, client.New(s.options(tr, "a")), r)
			r.waitFor(t, evs[0].Sequence)
			start := time.Now()
			if err := stop(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("Run took %v to return", d)
			}
			// Asleep before a reconnect: every request refused with a long
			// Retry-After.
			s.setWrap(func(http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Retry-After", "3600")
					w.WriteHeader(http.StatusServiceUnavailable)
				})
			})
			stop = run(t, client.New(s.options(tr, "a")), r)
			time.Sleep(50 * time.Millisecond) // let it reach its sleep; not a synchronisation
			start = time.Now()
			if err := stop(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("Run took %v to return", d)
			}
		})
	}
}
