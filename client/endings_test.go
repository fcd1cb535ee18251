package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
)

// requestLog records when each request to a path arrived.
type requestLog struct {
	mu    sync.Mutex
	times map[string][]time.Time
}

func (l *requestLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		if l.times == nil {
			l.times = map[string][]time.Time{}
		}
		l.times[r.URL.Path] = append(l.times[r.URL.Path], time.Now())
		l.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

func (l *requestLog) get(path string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.times[path]...)
}

// publishing publishes n events on topic "a" (and one on "b" after each
// tenth) from a goroutine; wait returns them once all are published.
func publishing(t *testing.T, s *server, n int) (wait func() []replayd.Event) {
	t.Helper()
	done := make(chan []replayd.Event, 1)
	go func() {
		var out []replayd.Event
		for i := range n {
			ev, err := s.hub.Load().Publish(context.Background(), "a", map[string]any{"n": i, "pad": strings.Repeat("p", i%50)})
			if err != nil {
				t.Error(err)
				break
			}
			out = append(out, ev)
			if i%10 == 9 {
				s.hub.Load().Publish(context.Background(), "b", i)
			}
		}
		done <- out
	}()
	return func() []replayd.Event {
		select {
		case evs := <-done:
			return evs
		case <-time.After(wiretest.WaitFor):
			t.Fatal("publishing did not finish")
			return nil
		}
	}
}

// A proxy that cuts every connection after a few hundred bytes, mid-frame
// (mid-header, mid-answer), while events are published: every event
// arrives once, in order.
func TestProxyCutsMidFrame(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 10_000}})
			p := newProxy(t, s.srv.URL, 400, 0)
			first := s.publish(20, "a")
			opts := s.options(tr, "a")
			opts.SSE, opts.Poll = p.URL()+"/events", p.URL()+"/poll"
			opts.PollLimit = 3
			r := newRecorder()
			run(t, client.New(opts), r)
			evs := append(first, publishing(t, s, 150)()...)
			r.waitFor(t, evs[len(evs)-1].Sequence)
			r.check(t, evs, 0)
			if len(r.msgs) != len(evs) {
				t.Fatalf("%d messages for %d events: %s", len(r.msgs), len(evs), r)
			}
			if p.cuts.Load() < 3 {
				t.Fatalf("only %d connections cut", p.cuts.Load())
			}
			t.Logf("%d connections cut", p.cuts.Load())
		})
	}
}

// A proxy that delays every chunk: slow, but everything arrives.
func TestProxyDelays(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			p := newProxy(t, s.srv.URL, 0, 2*time.Millisecond)
			opts := s.options(tr, "a")
			opts.SSE, opts.Poll = p.URL()+"/events", p.URL()+"/poll"
			r := newRecorder()
			run(t, client.New(opts), r)
			evs := publishing(t, s, 60)()
			r.waitFor(t, evs[len(evs)-1].Sequence)
			r.check(t, evs, 0)
		})
	}
}

// Past MaxConnections the client waits as told (the overload answer's
// retry, a poll's Retry-After) and gets in once a slot frees.
func TestOverload(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{SSE: replayd.SSEOptions{MaxConnections: 1, OverloadRetry: 40 * time.Millisecond}})
			evs := s.publish(3, "a")
			holder := wiretest.Dial(t, s.srv.URL+"/events", nil) // takes the only slot
			holder.Hello()
			var l requestLog
			s.setWrap(l.wrap)
			r := newRecorder()
			run(t, client.New(s.options(tr, "a")), r)
			path := "/events"
			if tr == client.Poll {
				path = "/poll"
			}
			wiretest.WaitUntil(t, "two refused requests", func() bool { return len(l.get(path)) >= 2 })
			if tr == client.Auto {
				// Three overload answers in a row: the client falls back
				// to polls.
				wiretest.WaitUntil(t, "a fall back to polls", func() bool { return len(l.get("/poll")) > 0 })
				if n := len(l.get(path)); n != 3 {
					t.Fatalf("fell back after %d SSE attempts, want 3", n)
				}
			}
			holder.Close()
			r.waitFor(t, evs[2].Sequence)
			r.check(t, evs, 0)
			times := l.get(path)
			least := 40 * time.Millisecond // the overload answer's retry is 1x to 2x OverloadRetry
			if tr == client.Poll {
				least = time.Second // Retry-After: 1
			}
			for i := 1; i < 2; i++ {
				if d := times[i].Sub(times[i-1]); d < least {
					t.Fatalf("request %d came %v after the refused one, want at least %v", i, d, least)
				}
			}
		})
	}
}

// A 503 with Retry-After (a proxy, a server shutting down): the client
// waits that long, then goes on.
func TestRetryAfter(t *testing.T) {
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			evs := s.publish(2, "a")
			var l requestLog
			var mu sync.Mutex
			refused := 0
			s.setWrap(func(next http.Handler) http.Handler {
				return l.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					refuse := refused < 1
					refused++
					mu.Unlock()
					if refuse {
						w.Header().Set("Retry-After", "1")
						http.Error(w, "busy", http.StatusServiceUnavailable)
						return
					}
					next.ServeHTTP(w, r)
				}))
			})
			r := newRecorder()
			run(t, client.New(s.options(tr, "a")), r)
			r.waitFor(t, evs[1].Sequence)
			path := "/" + map[client.Transport]string{client.SSE: "events", client.Poll: "poll"}[tr]
			times := l.get(path)
			if d := times[1].Sub(times[0]); d < time.Second {
				t.Fatalf("retried %v after a 503 with Retry-After: 1", d)
			}
		})
	}
}

// A server that ends streams and answers waiting polls on its own (the
// request's context ends: a revocation, a proxy's timeout): the client
// resumes each time, nothing lost or repeated.
func TestServerEndsRequests(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			s.setWrap(func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					ctx, cancel := context.WithTimeout(r.Context(), 20*time.Millisecond)
					defer cancel()
					next.ServeHTTP(w, r.WithContext(ctx))
				})
			})
			r := newRecorder()
			run(t, client.New(s.options(tr, "a")), r)
			evs := publishing(t, s, 100)()
			r.waitFor(t, evs[len(evs)-1].Sequence)
			r.check(t, evs, 0)
			if len(r.msgs) != len(evs) {
				t.Fatalf("%d messages for %d events", len(r.msgs), len(evs))
			}
		})
	}
}

// The hub closes (every stream ends, every waiting poll is answered) and a
// new hub opens on the same file at the same address: the client goes on.
func TestHubRestart(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			r := newRecorder()
			run(t, client.New(s.options(tr, "a")), r)
			evs := s.publish(5, "a")
			r.waitFor(t, evs[4].Sequence)
			for range 3 {
				s.restart()
				more := s.publish(5, "a")
				r.waitFor(t, more[4].Sequence)
				evs = append(evs, more...)
			}
			r.check(t, evs, 0)
			if len(r.msgs) != len(evs) {
				t.Fatalf("%d messages for %d events", len(r.msgs), len(evs))
			}
		})
	}
}

// A client too slow for the server's buffer is cut off (a clean end of
// the stream) and resumes from its cursor: with a replay limit above the
// backlog, nothing is lost.
func TestSlowConsumerCut(t *testing.T) {
	for _, tr := range []client.Transport{client.SSE, client.Auto} {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{SSE: replayd.SSEOptions{MaxBufferedBytes: 8 << 10, ReplayLimit: 100_000}})
			release := make(chan struct{})
			r := newRecorder()
			var once sync.Once
			r.refuse = func(client.Message) error {
				once.Do(func() { <-release }) // the first event holds the stream
				return nil
			}
			run(t, client.New(s.options(tr, "a")), r)
			pad := strings.Repeat("x", 1000)
			evs := s.publish(1, "a")
			for range 3000 {
				ev, err := s.hub.Load().Publish(context.Background(), "a", pad)
				if err != nil {
					t.Fatal(err)
				}
				evs = append(evs, ev)
				if s.hub.Load().Metrics().SlowConsumerDisconnects > 0 {
					break
				}
			}
			if s.hub.Load().Metrics().SlowConsumerDisconnects == 0 {
				t.Fatal("the server never cut the slow client")
			}
			close(release)
			r.waitFor(t, evs[len(evs)-1].Sequence)
			r.check(t, evs, 0)
			if len(r.msgs) != len(evs) {
				t.Fatalf("%d messages for %d events", len(r.msgs), len(evs))
			}
		})
	}
}

// Auto falls back to long polls when three SSE attempts in a row end
// without a hello (a proxy that answers streams with an empty 200, then
// one that answers 502).
func TestAutoFallback(t *testing.T) {
	for _, name := range []string{"empty stream", "502"} {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			var l requestLog
			s.setWrap(func(next http.Handler) http.Handler {
				return l.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path != "/events" {
						next.ServeHTTP(w, r)
						return
					}
					if name == "502" {
						http.Error(w, "bad gateway", http.StatusBadGateway)
						return
					}
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
				}))
			})
			evs := s.publish(3, "a")
			r := newRecorder()
			run(t, client.New(s.options(client.Auto, "a")), r)
			r.waitFor(t, evs[2].Sequence)
			more := s.publish(2, "a")
			r.waitFor(t, more[1].Sequence)
			r.check(t, append(evs, more...), 0)
			if n := len(l.get("/events")); n != 3 {
				t.Fatalf("%d SSE attempts before falling back, want 3", n)
			}
		})
	}
}

// An SSE connection on which nothing arrives for IdleTimeout is dropped
// and reopened; a slow handler does not count as silence.
func TestIdleTimeout(t *testing.T) {
	s := newServer(t, replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	var l requestLog
	var mu sync.Mutex
	silent := true
	s.setWrap(func(next http.Handler) http.Handler {
		return l.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			first := silent
			silent = false
			mu.Unlock()
			if !first {
				next.ServeHTTP(w, r)
				return
			}
			// A stream that never says anything.
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			<-r.Context().Done()
		}))
	})
	evs := s.publish(3, "a")
	opts := s.options(client.SSE, "a")
	opts.IdleTimeout = 50 * time.Millisecond
	r := newRecorder()
	r.refuse = func(m client.Message) error {
		time.Sleep(150 * time.Millisecond) // a slow handler, three times the idle timeout
		return nil
	}
	run(t, client.New(opts), r)
	r.waitFor(t, evs[2].Sequence)
	if n := len(l.get("/events")); n != 2 {
		t.Fatalf("%d connections, want 2: the silent one, then one that a slow handler must not end", n)
	}
}

// A poll answer that does not move the cursor (more owed but no events, a
// gap on every answer, an unknown_cursor gap naming the same cursor) is
// answered with backoff, as an error is, not re-polled at once; answers
// that move it again are polled at once.
func TestPollNoProgressBacksOff(t *testing.T) {
	for _, tc := range []struct{ name, stall string }{
		{"more", `{"topics":[],"cursor":5,"head":9,"more":true,"gap":null,"events":[]}`},
		{"gap", `{"topics":[],"cursor":5,"head":9,"more":false,"gap":{"reason":"pruned","resumedFrom":5,"missedFrom":1,"missedThrough":5,"missed":null,"replayLimit":100},"events":[]}`},
		{"unknown_cursor", `{"topics":[],"cursor":5,"head":5,"more":false,"gap":{"reason":"unknown_cursor","resumedFrom":5,"missedFrom":null,"missedThrough":null,"missed":null,"replayLimit":100},"events":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var progress atomic.Bool
			var mu sync.Mutex
			var times []time.Time // of the requests answered with progress
			s := newScripted(t, func(w http.ResponseWriter, r *http.Request, n int, cursor int64) {
				if !progress.Load() {
					fmt.Fprint(w, tc.stall)
					return
				}
				mu.Lock()
				times = append(times, time.Now())
				mu.Unlock()
				if cursor >= 14 {
					hold(w, r)
					return
				}
				id := max(cursor, 9) + 1
				fmt.Fprintf(w, `{"topics":[],"cursor":%d,"head":14,"more":%t,"gap":null,"events":[{"id":%d,"type":"message","topic":null,"data":%d}]}`,
					id, id < 14, id, id)
			})
			opts := s.options(client.Poll)
			opts.Cursor, opts.MinBackoff, opts.MaxBackoff = 5, 50*time.Millisecond, 400*time.Millisecond
			r := newRecorder()
			run(t, client.New(opts), r)
			<-time.After(time.Second) // the window requests are counted in
			progress.Store(true)
			stalled := len(s.requests())
			r.waitFor(t, 14)
			// Full jitter over 50 ms×2ⁿ, at most 400 ms: about 8 in a
			// second; with no backoff, thousands.
			if stalled < 2 || stalled > 25 {
				t.Fatalf("%d polls in 1 s of answers that do not move the cursor, want 2 to 25", stalled)
			}
			mu.Lock()
			defer mu.Unlock()
			if d := times[4].Sub(times[0]); d > 300*time.Millisecond {
				t.Fatalf("5 answers that move the cursor took %v: still backing off", d)
			}
			if got := r.String(); !strings.HasSuffix(got, "10 11 12 13 14") {
				t.Fatalf("handed %s", got)
			}
			t.Logf("%d polls in 1 s of stalled answers", stalled)
		})
	}
}

// 204 No Content is a server's "stop reconnecting", as for an EventSource:
// Run returns a *StatusError at once, over each transport, after one
// request (Auto does not fall back to polls).
func TestNoContentStops(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newScripted(t, func(w http.ResponseWriter, r *http.Request, n int, cursor int64) {
				w.WriteHeader(http.StatusNoContent)
			})
			c := client.New(s.options(tr))
			errc := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { errc <- c.Run(ctx, newRecorder().handle) }()
			var err error
			select {
			case err = <-errc:
			case <-time.After(wiretest.WaitFor):
				t.Fatalf("Run still running %v after 204s; %d requests", wiretest.WaitFor, len(s.requests()))
			}
			var se *client.StatusError
			if !errors.As(err, &se) || se.StatusCode != http.StatusNoContent || !strings.Contains(err.Error(), "stop reconnecting") {
				t.Fatalf("Run: %v, want a *StatusError 204 saying to stop reconnecting", err)
			}
			if n := len(s.requests()); n != 1 {
				t.Fatalf("%d requests, want 1", n)
			}
		})
	}
}
