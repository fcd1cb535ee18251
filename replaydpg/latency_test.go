package replaydpg

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
)

// Cross-node delivery latency: node A publishes 100 events/s; an SSE client
// of node B (another store: its own pool and listener, as another
// machine's would be; StartTail with a 1 s fallback poll, so NOTIFY does
// the waking), over real HTTP, timestamps each frame. Each latency runs
// from the start of Publish on A to the frame read on B; every event must
// arrive, once and in order. Both nodes and the client are in this
// process.
func crossNodeLatency(tb testing.TB, n int) []time.Duration {
	tb.Helper()
	dsn, prefix := testDSN(tb), testPrefix(tb)
	ctx := testCtx(tb, time.Minute+time.Duration(n)*20*time.Millisecond)
	hub := func() *replayd.EventHub {
		h, err := replayd.NewWithStore(openPrefixDSN(tb, prefix, dsn), replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
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
	srv := httptest.NewServer(hubB.Handler())
	defer srv.Close()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	frames := make(chan sseFrame, 1024)
	done := make(chan error, 1)
	go func() { done <- readSSE(resp.Body, frames) }()
	defer func() { cancel(); resp.Body.Close(); <-done }()
	if f := <-frames; f.event != "hello" {
		tb.Fatalf("first frame %+v", f)
	}

	type arrival struct {
		at time.Time
		f  sseFrame
	}
	arrivals := make(chan arrival, n)
	go func() {
		for f := range frames {
			arrivals <- arrival{at: time.Now(), f: f}
		}
		close(arrivals)
	}()
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
			seq, err := strconv.ParseInt(a.f.id, 10, 64)
			var p struct{ T int64 }
			if err != nil || json.Unmarshal([]byte(a.f.data), &p) != nil {
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
// The target (issue 11): p99 <= 10 ms.
func BenchmarkCrossNodeLatency(b *testing.B) {
	lat := crossNodeLatency(b, max(b.N, 100))
	ms := func(p float64) float64 { return float64(quantile(lat, p).Microseconds()) / 1e3 }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(ms(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}
