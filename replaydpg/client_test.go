package replaydpg

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
)

// The Go client (package client) hops between two nodes on one PostgreSQL
// log, behind a balancer that sends each request to the other node and
// ends every stream and poll after 40 ms, while both nodes publish: over
// SSE, polls and auto, every event arrives once, in order (several nodes, docs/clients.md).
func TestClientHopsNodes(t *testing.T) {
	prefix := testPrefix(t)
	var nodes [2]*httptest.Server
	var hubs [2]*replayd.EventHub
	for i := range nodes {
		h, err := replayd.NewWithStore(openPrefix(t, prefix), replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 10_000}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		if _, err := h.StartTail(20*time.Millisecond, replayd.TailOptions{}); err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("/events", h.Handler())
		mux.Handle("/poll", h.PollHandler())
		nodes[i], hubs[i] = httptest.NewServer(mux), h
		t.Cleanup(nodes[i].Close)
	}
	var next, served [2]atomic.Int64
	balancer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := next[0].Add(1) % 2
		served[i].Add(1)
		ctx, cancel := context.WithTimeout(r.Context(), 40*time.Millisecond)
		defer cancel()
		nodes[i].Config.Handler.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(balancer.Close)

	for _, tr := range []client.Transport{client.SSE, client.Poll, client.Auto} {
		t.Run(string(tr), func(t *testing.T) {
			head, err := hubs[0].LatestSequence(testCtx(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			c := client.New(client.Options{SSE: balancer.URL + "/events", Poll: balancer.URL + "/poll", Transport: tr,
				Topics: []string{"a"}, Cursor: head, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, PollWait: time.Second})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var mu sync.Mutex
			var got []int64
			var want []int64
			errc := make(chan error, 1)
			go func() {
				errc <- c.Run(ctx, func(m client.Message) error {
					if m.Gap != nil {
						return errors.New("unexpected gap")
					}
					mu.Lock()
					got = append(got, m.Event.ID)
					mu.Unlock()
					// The sentinel by its payload: it can arrive before
					// its Publish returns, so before its sequence is known.
					if string(m.Event.Data) == `"sentinel"` {
						return errStopRun
					}
					return nil
				})
			}()
			var wg sync.WaitGroup
			var wmu sync.Mutex
			for i := range hubs {
				wg.Go(func() {
					for n := range 100 {
						topic := "a"
						if n%5 == 4 {
							topic = "b"
						}
						ev, err := hubs[i].Publish(context.Background(), topic, map[string]int{"node": i, "n": n})
						if err != nil {
							t.Error(err)
							return
						}
						if topic == "a" {
							wmu.Lock()
							want = append(want, ev.Sequence)
							wmu.Unlock()
						}
						time.Sleep(time.Millisecond) // spread over many hops; pacing, not synchronisation
					}
				})
			}
			wg.Wait()
			// A sentinel, last: the client stops at it.
			sentinel, err := hubs[0].Publish(context.Background(), "a", "sentinel")
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, sentinel.Sequence)
			if err := <-errc; !errors.Is(err, errStopRun) {
				t.Fatalf("Run: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			seen := map[int64]bool{}
			for i, id := range got {
				if i > 0 && id <= got[i-1] {
					t.Fatalf("event %d after %d", id, got[i-1])
				}
				seen[id] = true
			}
			for _, id := range want {
				if !seen[id] {
					t.Fatalf("event %d never handed (got %d of %d)", id, len(got), len(want))
				}
			}
			if len(got) != len(want) {
				t.Fatalf("%d events handed, %d published on the scope", len(got), len(want))
			}
			t.Logf("%d events over %d requests to node 0 and %d to node 1", len(got), served[0].Load(), served[1].Load())
		})
	}
}

var errStopRun = errors.New("reached the last event")
