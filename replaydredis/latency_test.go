package replaydredis

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// Cross-node delivery latency (issue 31, item 1): node A publishes 100
// events/s; an SSE client of node B (another store: its own clients and
// listener; StartTail with a 1 s fallback poll, so the listener's XREAD
// does the waking), over real HTTP, timestamps each frame, from the start
// of Publish on A to the frame read on B; every event must arrive, once
// and in order.
func crossNodeLatency(tb testing.TB, n int) []time.Duration {
	srv := redisserver.Start(tb)
	prefix := testPrefix(tb)
	hub := func() *replayd.EventHub {
		h, err := replayd.NewWithStore(openStore(tb, srv.URL(), prefix), replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { h.Close() })
		return h
	}
	hubA, hubB := hub(), hub()
	stop, err := hubB.StartTail(time.Second, replayd.TailOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	defer stop()
	hs := httptest.NewServer(hubB.Handler())
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+time.Duration(n)*20*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	type arrival struct {
		at time.Time
		f  chaostest.Frame
	}
	frames := make(chan chaostest.Frame, 1024)
	arrivals := make(chan arrival, n+1)
	go func() {
		chaostest.ReadFrames(resp.Body, frames)
		close(frames)
	}()
	go func() {
		for f := range frames {
			arrivals <- arrival{at: time.Now(), f: f}
		}
		close(arrivals)
	}()
	defer func() {
		cancel()
		resp.Body.Close()
		for range arrivals {
		}
	}()
	if a := <-arrivals; a.f.Event != "hello" {
		tb.Fatalf("first frame %+v", a.f)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var want []int64
	for i := range n {
		<-tick.C
		start := time.Now()
		ev, err := hubA.Publish(ctx, "", map[string]int64{"i": int64(i), "t": start.UnixNano()})
		if err != nil {
			tb.Fatal(err)
		}
		want = append(want, ev.Sequence)
	}
	var (
		lat []time.Duration
		got []int64
	)
	timeout := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case a, ok := <-arrivals:
			if !ok {
				tb.Fatalf("stream ended after %d events", len(got))
			}
			seq, err := strconv.ParseInt(a.f.ID, 10, 64)
			var p struct{ T int64 }
			if err != nil || json.Unmarshal([]byte(a.f.Data), &p) != nil {
				tb.Fatalf("bad frame %+v", a.f)
			}
			got = append(got, seq)
			lat = append(lat, a.at.Sub(time.Unix(0, p.T)))
		case <-timeout:
			tb.Fatalf("node B's client got %d of %d events within 10s", len(got), n)
		}
	}
	if !slices.Equal(got, want) {
		tb.Fatalf("node B's client got %v, want %v", got, want)
	}
	slices.Sort(lat)
	return lat
}

// quantile returns the p-quantile of sorted.
func quantile(sorted []time.Duration, p float64) time.Duration {
	return sorted[int(p*float64(len(sorted)-1))]
}

// TestCrossNodeLatency runs crossNodeLatency for 3 s and logs the
// quantiles; it asserts only that every event arrived, once and in order:
// the numbers depend on the machine's load (BenchmarkCrossNodeLatency
// reports them).
func TestCrossNodeLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("3 s measurement")
	}
	lat := crossNodeLatency(t, 300)
	q := func(p float64) time.Duration { return quantile(lat, p).Round(10 * time.Microsecond) }
	t.Logf("publish on A -> frame on B, %d events at 100/s: p50 %v, p90 %v, p99 %v, max %v", len(lat), q(0.5), q(0.9), q(0.99), q(1))
}

// BenchmarkCrossNodeLatency: crossNodeLatency with b.N events (at 100/s:
// -benchtime 1000x is 10 s), reporting p50, p99 and max in milliseconds.
// The target (issue 31): p99 <= 10 ms.
func BenchmarkCrossNodeLatency(b *testing.B) {
	lat := crossNodeLatency(b, max(b.N, 100))
	ms := func(p float64) float64 { return float64(quantile(lat, p).Microseconds()) / 1e3 }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(ms(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}
