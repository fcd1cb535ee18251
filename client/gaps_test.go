package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
)

// Gaps reach the handler as values, before the events that follow them,
// with every key; the ones below the cursor move it to the head.
func TestGaps(t *testing.T) {
	t.Run("replay_limit", func(t *testing.T) {
		s := newServer(t, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 3}})
		evs := s.publish(10, "a")
		r := newRecorder()
		run(t, client.New(s.options(client.SSE, "a")), r)
		r.waitFor(t, evs[9].Sequence)
		g := r.msgs[0].Gap
		if g == nil || g.Reason != "replay_limit" || *g.MissedFrom != evs[0].Sequence || *g.MissedThrough != evs[6].Sequence ||
			*g.Missed != 7 || *g.ResumedFrom != 0 || g.ReplayLimit != 3 || len(r.msgs) != 4 {
			t.Fatalf("got %s, want a replay_limit gap over the first 7, then 3 events", r)
		}
		r.check(t, evs, 0)
	})
	for _, tr := range transports {
		t.Run("pruned/"+string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			evs := s.publish(10, "a")
			if _, err := s.hub.Load().Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 4}); err != nil {
				t.Fatal(err)
			}
			r := newRecorder()
			run(t, client.New(s.options(tr, "a")), r)
			r.waitFor(t, evs[9].Sequence)
			if g := r.msgs[0].Gap; g == nil || g.Reason != "pruned" || g.Missed != nil || len(r.msgs) != 5 {
				t.Fatalf("got %s, want a pruned gap then 4 events", r)
			}
			r.check(t, evs, 0)
		})
		// A cursor the log never issued: above its head (a log reset or
		// replaced), or inside the range it skipped when it was opened (a
		// log restored from a backup); both move the client to the head.
		for _, foreign := range []struct {
			name   string
			cursor func(head int64) int64
		}{
			{"above_head", func(head int64) int64 { return head + 1000 }},
			{"skipped", func(head int64) int64 { return 1000 }},
		} {
			t.Run("unknown_cursor/"+foreign.name+"/"+string(tr), func(t *testing.T) {
				s := newServer(t, replayd.Options{})
				old := s.publish(3, "a")
				opts := s.options(tr, "a")
				opts.Cursor = foreign.cursor(old[2].Sequence)
				c := client.New(opts)
				r := newRecorder()
				run(t, c, r)
				wiretest.WaitUntil(t, "the gap", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.msgs) > 0 })
				if g := r.msgs[0].Gap; g == nil || g.Reason != "unknown_cursor" || *g.ResumedFrom != opts.Cursor || g.MissedFrom != nil {
					t.Fatalf("got %s, want an unknown_cursor gap", r)
				}
				wiretest.WaitUntil(t, "the cursor at the head", func() bool { return c.Cursor() == old[2].Sequence })
				fresh := s.publish(2, "a")
				r.waitFor(t, fresh[1].Sequence)
				r.check(t, fresh, old[2].Sequence)
				if len(r.msgs) != 3 {
					t.Fatalf("got %s", r)
				}
			})
		}
	}
	t.Run("invalid_cursor", func(t *testing.T) {
		s := newServer(t, replayd.Options{})
		old := s.publish(3, "a")
		var once sync.Once
		s.setWrap(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				once.Do(func() { r.Header.Set("Last-Event-ID", "abc") }) // mangled on the way
				next.ServeHTTP(w, r)
			})
		})
		opts := s.options(client.SSE, "a")
		opts.Cursor = old[0].Sequence // this log's, but the server reads "abc"
		c := client.New(opts)
		r := newRecorder()
		run(t, c, r)
		wiretest.WaitUntil(t, "the cursor at the head", func() bool { return c.Cursor() == old[2].Sequence })
		fresh := s.publish(1, "a")
		r.waitFor(t, fresh[0].Sequence)
		if g := r.msgs[0].Gap; g == nil || g.Reason != "invalid_cursor" || g.ResumedFrom != nil || len(r.msgs) != 2 {
			t.Fatalf("got %s, want an invalid_cursor gap, then the new event", r)
		}
	})
}

// A server that sends again what the client has (a buggy proxy cache, a
// replica behind): ids at or below the cursor are dropped; SSE frames in
// any line ending, multi-line data joined.
func TestDropsRepeats(t *testing.T) {
	// A server per transport: a request of the SSE client still in flight
	// when its Run returned must not take the poll client's first answer.
	serve := func(t *testing.T) *httptest.Server {
		var mu sync.Mutex
		calls := 0
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if r.URL.Path == "/poll" {
				w.Header().Set("Content-Type", "application/json")
				if n == 1 {
					fmt.Fprint(w, `{"topics":[],"cursor":3,"head":3,"more":false,"gap":null,"events":[`+
						`{"id":1,"type":"message","topic":null,"data":1},{"id":3,"type":"message","topic":"x","data":3}]}`)
					return
				}
				fmt.Fprint(w, `{"topics":[],"cursor":5,"head":5,"more":false,"gap":null,"events":[`+
					`{"id":2,"type":"message","topic":null,"data":2},{"id":3,"type":"message","topic":null,"data":3},{"id":5,"type":"t","topic":null,"data":5}]}`)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			if n == 1 {
				fmt.Fprint(w, "id: 0\r\nevent: hello\r\ndata: {\"cursor\":0,\"head\":3}\r\n\r\nid: 1\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n: hi\n\nid: 3\nevent: heartbeat\ndata: 3\n\nevent: heartbeat\ndata: {}\n\n")
				return
			}
			fmt.Fprint(w, "id: 3\nevent: hello\ndata: {\"cursor\":3,\"head\":5}\n\nid: 2\ndata: 2\n\nid: 3\ndata: 3\n\nid: 5\nevent: t\ndata: 5\n\n")
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		t.Run(string(tr), func(t *testing.T) {
			srv := serve(t)
			r := newRecorder()
			c := client.New(client.Options{SSE: srv.URL + "/events", Poll: srv.URL + "/poll", Transport: tr, MinBackoff: 1, MaxBackoff: 1})
			run(t, c, r)
			r.waitFor(t, 5)
			want := "3 messages: 1 3 5"
			if got := r.String(); got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
			if tr == client.SSE && (string(r.msgs[0].Event.Data) != "{\"a\":\n1}" || r.msgs[1].Event.Type != "heartbeat" || r.msgs[2].Event.Type != "t") {
				t.Fatalf("events %+v %+v %+v", r.msgs[0].Event, r.msgs[1].Event, r.msgs[2].Event)
			}
		})
	}
}

// A gap that comes after events (from a server other than replayd, a
// proxy, a future change) never moves the cursor backwards: the part of
// its range above the cursor is handed and the cursor moves past it, a
// range at or below the cursor is dropped, an unknown_cursor gap mid-stream
// leaves the cursor where it is. Nothing is handed twice, over SSE and
// polls, across the reconnect that follows.
func TestGapNeverMovesCursorBack(t *testing.T) {
	const (
		late  = `{"reason":"pruned","resumedFrom":5,"missedFrom":6,"missedThrough":12,"missed":null,"replayLimit":100}`
		stale = `{"reason":"pruned","resumedFrom":5,"missedFrom":6,"missedThrough":8,"missed":null,"replayLimit":100}`
		reset = `{"reason":"unknown_cursor","resumedFrom":5,"missedFrom":null,"missedThrough":null,"missed":null,"replayLimit":100}`
	)
	log := []int64{10, 13} // the server's events; the client starts at 5
	cases := []struct {
		name, gap string
		want      string  // what the handler is handed
		cursors   []int64 // Cursor, read in the handler at each message
		resumed   int64   // the cursor the reconnect carries
	}{
		{"late", late, "3 messages: 10 gap(pruned 11-12) 13", []int64{5, 10, 12}, 12},
		{"stale", stale, "2 messages: 10 13", []int64{5, 10}, 10},
		{"reset", reset, "3 messages: 10 gap(unknown_cursor <nil>-<nil>) 13", []int64{5, 10, 10}, 10},
	}
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		for _, tc := range cases {
			if tr == client.Poll && tc.name == "reset" {
				continue // a poll's unknown_cursor answer names the head of another history: the cursor goes there
			}
			t.Run(string(tr)+"/"+tc.name, func(t *testing.T) {
				s := newScripted(t, func(w http.ResponseWriter, r *http.Request, n int, cursor int64) {
					if tr == client.Poll {
						switch {
						case n == 1:
							fmt.Fprint(w, `{"topics":[],"cursor":10,"head":13,"more":false,"gap":null,"events":[{"id":10,"type":"message","topic":null,"data":10}]}`)
						case n == 2:
							// The gap after event 10, with a cursor below
							// the request's.
							fmt.Fprintf(w, `{"topics":[],"cursor":3,"head":13,"more":false,"gap":%s,"events":[]}`, tc.gap)
						case cursor >= 13:
							hold(w, r)
						default:
							var evs []string
							for _, id := range log {
								if id > cursor {
									evs = append(evs, fmt.Sprintf(`{"id":%d,"type":"message","topic":null,"data":%d}`, id, id))
								}
							}
							fmt.Fprintf(w, `{"topics":[],"cursor":13,"head":13,"more":false,"gap":null,"events":[%s]}`, strings.Join(evs, ","))
						}
						return
					}
					fmt.Fprintf(w, "id: %d\nevent: hello\ndata: {\"cursor\":%d,\"head\":13}\n\n", cursor, cursor)
					for _, id := range log {
						if id > cursor {
							fmt.Fprintf(w, "id: %d\ndata: %d\n\n", id, id)
						}
						if n == 1 {
							fmt.Fprintf(w, "event: gap\ndata: %s\n\n", tc.gap)
							return // and the connection ends
						}
					}
					hold(w, r)
				})
				opts := s.options(tr)
				opts.Cursor = 5
				c := client.New(opts)
				r := newRecorder()
				var cursors []int64
				r.refuse = func(client.Message) error {
					cursors = append(cursors, c.Cursor())
					return nil
				}
				run(t, c, r)
				r.waitFor(t, 13)
				r.mu.Lock()
				seen := slices.Clone(cursors)
				r.mu.Unlock()
				if got := r.String(); got != tc.want || !slices.Equal(seen, tc.cursors) {
					t.Fatalf("handed %q with Cursor %v; want %q with %v", got, seen, tc.want, tc.cursors)
				}
				i := 1 // the request after the gap
				if tr == client.Poll {
					i = 2
				}
				if got := s.requests(); len(got) <= i || got[i] != tc.resumed {
					t.Fatalf("requests carried cursors %v, want request %d at %d", got, i+1, tc.resumed)
				}
				// The cursor moves once the handler has returned.
				wiretest.WaitUntil(t, "the cursor at 13", func() bool { return c.Cursor() == 13 })
			})
		}
	}
}

// A topic pruned whole, nothing of it left: the pruned gap is handed once
// and the client waits for the next event (over polls the cursor moves
// past the range, so the next poll is held instead of answered with the
// same gap again).
func TestPrunedGapOnce(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			s := newServer(t, replayd.Options{})
			old := s.publish(5, "a")
			s.publish(5, "b")
			if _, err := s.hub.Load().Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 5}); err != nil {
				t.Fatal(err)
			}
			var l requestLog
			s.setWrap(l.wrap)
			c := client.New(s.options(tr, "a"))
			r := newRecorder()
			run(t, c, r)
			r.waitFor(t, old[4].Sequence)
			fresh := s.publish(1, "a")
			r.waitFor(t, fresh[0].Sequence)
			want := fmt.Sprintf("2 messages: gap(pruned 1-%d) %d", old[4].Sequence, fresh[0].Sequence)
			if got := r.String(); got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
			if n := len(l.get("/poll")); n > 3 {
				t.Fatalf("%d polls for one gap and one event", n)
			}
		})
	}
}
