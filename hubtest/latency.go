package hubtest

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
	"github.com/replayd/replayd/internal/wiretest"
)

// CrossNodeLatency measures cross-node delivery, for a backend's latency
// test: a publishes n events at 100 a second; an SSE client of b (another
// hub on the same log, on its own store, tailing: the caller starts its
// StartTail), over real HTTP, timestamps each frame. Each latency runs
// from the start of Publish on a to the frame read from b. It fails tb
// unless every event arrives, once and in order, and returns the
// latencies, sorted (see Quantile). Both hubs need HeartbeatInterval -1.
func CrossNodeLatency(tb testing.TB, a, b *replayd.EventHub, n int) []time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+time.Duration(n)*20*time.Millisecond)
	defer cancel()
	srv := httptest.NewServer(b.Handler())
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	type arrival struct {
		at time.Time
		f  wiretest.Frame
	}
	frames := make(chan wiretest.Frame, 1024)
	arrivals := make(chan arrival, n+1)
	go func() {
		wiretest.ReadFrames(resp.Body, frames)
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
		ev, err := a.Publish(ctx, "", map[string]int64{"i": int64(i), "t": start.UnixNano()})
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
		case ar, ok := <-arrivals:
			if !ok {
				tb.Fatalf("stream ended after %d events", len(got))
			}
			seq, err := strconv.ParseInt(ar.f.ID, 10, 64)
			var p struct{ T int64 }
			if err != nil || json.Unmarshal([]byte(ar.f.Data), &p) != nil {
				tb.Fatalf("bad frame %+v", ar.f)
			}
			got = append(got, seq)
			lat = append(lat, ar.at.Sub(time.Unix(0, p.T)))
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

// Quantile returns the p-quantile of sorted latencies.
func Quantile(sorted []time.Duration, p float64) time.Duration {
	return sorted[int(p*float64(len(sorted)-1))]
}
