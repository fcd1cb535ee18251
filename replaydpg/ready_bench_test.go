package replaydpg

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkReadyDuringPublish measures what Ready's probe costs a publish
// burst and whether it fails a healthy node: 64 goroutines publish through
// one hub without pause, and each round (b.N counts them) runs three
// phases of a second each, in turn, each round starting with the next:
// nothing else; Ready (2 s ctx, as ReadyHandler) every 100 ms; and, for
// comparison, the probe NOWAIT would be ("SELECT … FOR UPDATE NOWAIT" on
// the head row, rolled back) every 100 ms from a connection of its own.
// It reports the publish rate of each phase, the ratio with Ready to
// without, Ready's failures and latency (p50, max), and how often NOWAIT
// found the lock taken: a Ready built on it would have failed that often
// on a node whose every publish was getting through.
func BenchmarkReadyDuringPublish(b *testing.B) {
	prefix := testPrefix(b)
	hub, _ := benchHub(b, prefix)
	raw := testPool(b)
	var (
		published atomic.Int64
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	payload := json.RawMessage(`{"n":1}`)
	for range benchPublishers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := hub.Publish(context.Background(), "room", payload); err != nil {
					b.Error(err)
					return
				}
				published.Add(1)
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	const phase, every = time.Second, 100 * time.Millisecond
	// run runs probe every 100 ms for a phase and returns the events
	// published meanwhile.
	run := func(probe func()) int64 {
		n0 := published.Load()
		end := time.Now().Add(phase)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for time.Now().Before(end) {
			select {
			case <-tick.C:
				if probe != nil {
					probe()
				}
			case <-time.After(time.Until(end)):
			}
		}
		return published.Load() - n0
	}
	var (
		plain, withReady, withNowait int64
		readyFails, nowaitBusy, n    int
		lat                          []time.Duration
	)
	run(nil) // warm up
	b.ResetTimer()
	readyProbe := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		if err := hub.Ready(ctx); err != nil {
			readyFails++
			b.Log(err)
		}
		lat = append(lat, time.Since(start))
	}
	nowaitProbe := func() {
		n++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		tx, err := raw.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1 FROM `+prefix+`head WHERE id = 1 FOR UPDATE NOWAIT`); err != nil {
			nowaitBusy++
		}
	}
	for i := range b.N {
		// The phases in turn, each round starting with another, so that
		// none always follows the same one.
		for k := range 3 {
			switch (i + k) % 3 {
			case 0:
				plain += run(nil)
			case 1:
				withReady += run(readyProbe)
			case 2:
				withNowait += run(nowaitProbe)
			}
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	secs := phase.Seconds() * float64(b.N)
	b.ReportMetric(float64(plain)/secs, "events/s")
	b.ReportMetric(float64(withReady)/secs, "events/s-ready")
	b.ReportMetric(float64(withNowait)/secs, "events/s-nowait")
	b.ReportMetric(float64(withReady)/float64(plain), "ready/plain")
	b.ReportMetric(float64(readyFails), "ready-fails")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "ready-p50-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "ready-max-ms")
	b.ReportMetric(100*float64(nowaitBusy)/float64(n), "nowait-busy-%")
}
