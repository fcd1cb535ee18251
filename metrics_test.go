package replayd

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// A value equal to a bound falls in that bound's bucket; above the last
// bound, in +Inf. Counts are cumulative, Count is every observation.
func TestHistogramBuckets(t *testing.T) {
	var h histogram
	bounds := []int64{0, 1, 5}
	for _, v := range []int64{0, 0, 1, 2, 5, 6, 100, -3} {
		h.observe(bounds, v)
	}
	s := h.snapshot(bounds, 1)
	if !slices.Equal(s.Bounds, []float64{0, 1, 5}) || !slices.Equal(s.Counts, []uint64{3, 4, 6}) || s.Count != 8 || s.Sum != 114 {
		t.Fatalf("snapshot %+v", s)
	}
	var d histogram
	d.observe(publishBounds, int64(100*time.Microsecond))
	d.observe(publishBounds, int64(20*time.Second))
	ds := d.snapshot(publishBounds, 1e9)
	if ds.Bounds[1] != 0.0001 || ds.Counts[0] != 0 || ds.Counts[1] != 1 || ds.Counts[len(ds.Counts)-1] != 1 || ds.Count != 2 || ds.Sum != 20.0001 {
		t.Fatalf("duration snapshot %+v", ds)
	}
	if len(publishBounds) > maxBounds || len(replayBounds) > maxBounds ||
		!slices.IsSorted(publishBounds) || !slices.IsSorted(replayBounds) {
		t.Fatal("bounds must be ascending and at most maxBounds")
	}
}

// Recording allocates nothing.
func TestMetricsRecordingDoesNotAllocate(t *testing.T) {
	var m metrics
	allocs := testing.AllocsPerRun(1000, func() {
		m.publishDuration(123 * time.Microsecond)
		m.replayed(transportSSE, 7)
		m.replayed(transportPoll, 0)
		m.FramesQueued(1)
		m.gap(reasonPruned)
		m.refused(refusedOrigin)
		m.connOpened(transportSSE)
		m.connClosed(transportSSE)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per recording", allocs)
	}
}

// The tail's lag is the age of the newest row it delivered: rows another
// hub committed a while before the tail polls are that old; a poll that
// finds nothing new sets it back to 0, and so does stopping the tail.
func TestMetricsTailLag(t *testing.T) {
	db, path := openTestDB(t)
	server := newTestHub(t, db, Options{})
	worker := secondHub(t, path, Options{})
	seen := recordLive(t, server) // the tail reads rows only for subscribers

	ev := mustPublish(t, worker, "a", 1)
	const age = 100 * time.Millisecond
	time.Sleep(age)                                         // the row grows old: no signal stands for elapsed time
	stop, err := server.StartTail(time.Hour, TailOptions{}) // polls once, now
	if err != nil {
		t.Fatal(err)
	}
	wiretest.WaitUntil(t, "the tail to deliver", func() bool { return len(seen()) == 1 })
	wiretest.WaitUntil(t, "the poll to be counted", func() bool { return server.Metrics().TailPolls == 1 })
	lag := server.Metrics().TailLag
	if max := time.Since(ev.CreatedAt); lag < age || lag > max {
		t.Fatalf("tail lag %v, want between %v and %v", lag, age, max)
	}
	stop()
	if lag := server.Metrics().TailLag; lag != 0 {
		t.Fatalf("tail lag %v after stop", lag)
	}

	// A poll that finds rows sets the lag; the next, caught up, sets 0.
	mustPublish(t, worker, "a", 2)
	time.Sleep(age)
	for i, want := range []int{1, 0} {
		n, err := server.tailOnce(context.Background())
		lag := server.Metrics().TailLag
		if err != nil || n != want || (n == 1) != (lag >= age) || (n == 0) != (lag == 0) {
			t.Fatalf("poll %d: %d rows, %v, lag %v", i, n, err, lag)
		}
	}
}

// BenchmarkMetricsRecord is the recording a publish adds: one duration
// observation and one counter.
func BenchmarkMetricsRecord(b *testing.B) {
	var m metrics
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m.publishDuration(time.Duration(i&0xffff) * time.Microsecond)
		m.publishedEvents(1)
	}
}
