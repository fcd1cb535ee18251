package hubtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// PruneTopicCost measures what pruning one topic of rows rows costs
// everyone else (issue 30, item 3); it checks nothing but that the run
// works, and logs its figures. On a hub open makes: 64 publishers, each on
// a topic of its own at 10 events/s, their ticks spread evenly over the
// 100 ms (REPLAYD_PRUNE_COST_BURSTS=1: all together), and 1,000 SSE
// clients of those topics over real HTTP (10,000 deliveries/s); the
// publish latency and the
// delivery latency (publish start to the client's read) are recorded in
// windows with and without a PruneTopic of a "bulk" topic running,
// paired: each pair refills the bulk topic with rows rows and measures
// the two windows, of the same length, in alternating order. It takes
// minutes; a backend's test runs it on request only, e.g.
//
//	REPLAYD_PRUNE_COST=1 go test -run '^TestPruneTopicCost$' -v -timeout 30m .
//
// The pairs' samples are also pooled. REPLAYD_PRUNE_COST_CONTROL=60s makes
// the "with" windows prune nothing and last 60 s (the noise);
// REPLAYD_PRUNE_COST_PROFILE=dir writes each window's execution trace.
func PruneTopicCost(t *testing.T, open func(replayd.Options) *replayd.EventHub, rows, pairs int) {
	const publishers, clients, perPublisher = 64, 1000, 10 // events/s each: 640/s, 10,000 deliveries/s
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 0}})
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The recording: each sample lands in the window current when taken.
	type window struct {
		mu                sync.Mutex
		publish, delivery []time.Duration
	}
	var cur atomic.Pointer[window]
	record := func(pub bool, d time.Duration) {
		w := cur.Load()
		if w == nil {
			return
		}
		w.mu.Lock()
		if pub {
			w.publish = append(w.publish, d)
		} else {
			w.delivery = append(w.delivery, d)
		}
		w.mu.Unlock()
	}

	// Clients: topic p(i mod 64).
	var ready sync.WaitGroup
	var wg sync.WaitGroup
	for i := range clients {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s?topic=p%d", srv.URL, i%publishers), nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ready.Done()
				t.Errorf("client %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			hello, heartbeat := true, false
			for sc.Scan() {
				line := sc.Text()
				switch {
				case hello && line == "":
					hello = false
					ready.Done()
				case line == "":
					heartbeat = false
				case line == "event: heartbeat":
					heartbeat = true // its data's t is the server's clock in ms
				}
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok || hello || heartbeat {
					continue
				}
				var p struct{ T int64 }
				if json.Unmarshal([]byte(data), &p) == nil && p.T > 0 {
					record(false, time.Since(time.Unix(0, p.T)))
				}
			}
		}()
	}
	ready.Wait()

	// Publishers: paced, each on its own topic, their ticks spread evenly
	// over the period as independent publishers' would be. (Started
	// together, 64 tickers fire together: every 100 ms a burst of 64
	// publishes, whose samples come and go together, and a window's p99
	// was the slowest of its few dozen bursts.)
	// REPLAYD_PRUNE_COST_BURSTS=1 starts them together, for the bursts.
	period, bursts := time.Second/perPublisher, os.Getenv("REPLAYD_PRUNE_COST_BURSTS") != ""
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !bursts {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(p) * period / publishers): // the phase
				}
			}
			tick := time.NewTicker(period)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				start := time.Now()
				if _, err := h.Publish(ctx, fmt.Sprintf("p%d", p), map[string]int64{"t": start.UnixNano()}); err != nil {
					if ctx.Err() == nil {
						t.Errorf("publish: %v", err)
					}
					return
				}
				record(true, time.Since(start))
			}
		}()
	}

	fill := func() {
		batch := make([]replayd.Event, 1000)
		for i := 0; i < rows; i += len(batch) {
			for j := range batch {
				batch[j] = replayd.Event{Type: "bulk", Topic: "bulk", Payload: json.RawMessage(`{"bulk":true}`)}
			}
			for _, r := range h.PublishBatch(ctx, batch) {
				if r.Err != nil {
					t.Fatalf("fill: %v", r.Err)
				}
			}
		}
	}
	profiles := os.Getenv("REPLAYD_PRUNE_COST_PROFILE") // a directory: each window's execution trace
	windows := 0
	measure := func(d time.Duration, during func()) *window {
		w := &window{}
		time.Sleep(2 * time.Second) // settle after the fill
		if profiles != "" {
			name := "without"
			if during != nil {
				name = "with"
			}
			f, err := os.Create(filepath.Join(profiles, fmt.Sprintf("%d-%s.trace", windows, name)))
			if err != nil {
				t.Fatal(err)
			}
			windows++
			if err := trace.Start(f); err != nil {
				t.Fatal(err)
			}
			defer func() { trace.Stop(); f.Close() }()
		}
		cur.Store(w)
		start := time.Now()
		if during != nil {
			during()
		}
		if rest := d - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
		cur.Store(nil)
		return w
	}
	q := func(ds []time.Duration, p float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[int(math.Ceil(p*float64(len(s))))-1]
	}
	// REPLAYD_PRUNE_COST_CONTROL=5s makes the "with" windows prune
	// nothing and last 5s: how far two windows without differ.
	control, _ := time.ParseDuration(os.Getenv("REPLAYD_PRUNE_COST_CONTROL"))
	var last time.Duration // the last prune's length: a window without lasts as long
	var withAll, withoutAll window
	for pair := range pairs {
		fill()
		var pruneTook time.Duration
		var pruned int64
		prune := func() {
			if control > 0 { // no prune: a window as long, to see the noise
				time.Sleep(control)
				pruneTook = control
				return
			}
			start := time.Now()
			n, err := h.PruneTopic(ctx, "bulk", math.MaxInt64)
			if err != nil {
				t.Fatal(err)
			}
			pruneTook, pruned = time.Since(start), n
		}
		// Windows of the same length, in alternating order: the prune's
		// first (its length sets the other's), then one as long without;
		// every other pair the other way round, as long as the last prune.
		var with, without *window
		if pair%2 == 0 || last == 0 {
			with = measure(0, prune)
			fill()
			without = measure(pruneTook, nil)
			h.PruneTopic(ctx, "bulk", math.MaxInt64)
		} else {
			without = measure(last, nil)
			with = measure(0, prune)
		}
		last = pruneTook
		t.Logf("pair %d: PruneTopic deleted %d rows in %v (%.0f rows/s)", pair, pruned, pruneTook.Round(time.Millisecond), float64(pruned)/pruneTook.Seconds())
		for _, r := range []struct {
			name string
			w    *window
		}{{"without prune", without}, {"with prune", with}} {
			t.Logf("pair %d %-13s: %6d publishes p50 %v p99 %v max %v; %7d deliveries p50 %v p99 %v max %v", pair, r.name,
				len(r.w.publish), q(r.w.publish, .5), q(r.w.publish, .99), q(r.w.publish, 1),
				len(r.w.delivery), q(r.w.delivery, .5), q(r.w.delivery, .99), q(r.w.delivery, 1))
		}
		t.Logf("pair %d ratio with/without: publish p99 %.2f×, delivery p99 %.2f×", pair,
			float64(q(with.publish, .99))/float64(q(without.publish, .99)), float64(q(with.delivery, .99))/float64(q(without.delivery, .99)))
		withAll.publish, withAll.delivery = append(withAll.publish, with.publish...), append(withAll.delivery, with.delivery...)
		withoutAll.publish, withoutAll.delivery = append(withoutAll.publish, without.publish...), append(withoutAll.delivery, without.delivery...)
	}
	// The pairs' samples pooled: each window's p99 is that of a few
	// thousand publishes, and moves from pair to pair by more than the
	// 20% looked for.
	t.Logf("%d pairs pooled: publish p99 %v with, %v without (%.2f×); delivery p99 %v with, %v without (%.2f×)", pairs,
		q(withAll.publish, .99), q(withoutAll.publish, .99), float64(q(withAll.publish, .99))/float64(q(withoutAll.publish, .99)),
		q(withAll.delivery, .99), q(withoutAll.delivery, .99), float64(q(withAll.delivery, .99))/float64(q(withoutAll.delivery, .99)))
	cancel()
	wg.Wait()
}
