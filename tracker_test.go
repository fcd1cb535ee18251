package replayd

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// trackerClock is a settable clock for the tracker's idle rules.
type trackerClock struct{ now time.Time }

func (c *trackerClock) Now() time.Time { return c.now }

func newClockedTracker() (*TopicClientTracker, *trackerClock) {
	t := newTopicClientTracker()
	c := &trackerClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	t.now = c.Now
	return t, c
}

// Client-chosen topics cannot grow the tracker without bound: of the
// topics with no clients only the newest trackerMaxIdle are kept, while a
// topic with a client is never dropped, however old.
func TestTrackerBoundsIdleTopics(t *testing.T) {
	tr, clock := newClockedTracker()
	tr.opened([]string{"kept", "also"})
	const n = 3 * trackerMaxIdle
	for i := range n {
		clock.now = clock.now.Add(time.Millisecond)
		topic := []string{fmt.Sprint("t", i)}
		tr.opened(topic)
		tr.closed(topic)
	}
	snap := tr.Snapshot()
	if len(snap) != trackerMaxIdle+2 {
		t.Fatalf("%d topics kept, want %d idle + 2 active", len(snap), trackerMaxIdle)
	}
	idle := map[string]bool{}
	for _, ts := range snap {
		if ts.ActiveClients == 0 {
			idle[ts.Topic] = true
		}
	}
	for i := n - trackerMaxIdle; i < n; i++ {
		if !idle[fmt.Sprint("t", i)] {
			t.Fatalf("topic t%d, among the newest idle ones, was dropped", i)
		}
	}
	if tr.ActiveClients("kept") != 1 || tr.ActiveClients("also") != 1 || tr.Total() != 1 {
		t.Fatalf("active topics disturbed: kept %d, also %d, total %d", tr.ActiveClients("kept"), tr.ActiveClients("also"), tr.Total())
	}
	// A dropped topic that is requested again starts afresh.
	tr.opened([]string{"t0"})
	if tr.ActiveClients("t0") != 1 {
		t.Fatalf("t0 reopened: %d clients", tr.ActiveClients("t0"))
	}
}

// A topic idle for longer than trackerIdleTTL is dropped; one idle for
// less, or with a client, stays.
func TestTrackerDropsTopicsIdleOverAnHour(t *testing.T) {
	tr, clock := newClockedTracker()
	tr.opened([]string{"old"})
	tr.closed([]string{"old"})
	tr.opened([]string{"busy"}) // open all along
	clock.now = clock.now.Add(30 * time.Minute)
	tr.opened([]string{"recent"})
	tr.closed([]string{"recent"})
	clock.now = clock.now.Add(trackerIdleTTL - 30*time.Minute + time.Second)
	var got []string
	for _, ts := range tr.Snapshot() {
		got = append(got, ts.Topic)
	}
	if fmt.Sprint(got) != "[busy recent]" {
		t.Fatalf("topics %v, want [busy recent]", got)
	}
	// Reopening resets the idle clock: "recent" gets a client and keeps
	// it past the hour.
	tr.opened([]string{"recent"})
	clock.now = clock.now.Add(2 * trackerIdleTTL)
	if tr.ActiveClients("recent") != 1 || len(tr.Snapshot()) != 2 {
		t.Fatalf("active topics dropped: %+v", tr.Snapshot())
	}
}

// BenchmarkStatsManyTopics times Stats after 100,000 distinct topics have
// each had a connection open and close (issue 8, item 7), and reports the
// heap the tracker keeps.
func BenchmarkStatsManyTopics(b *testing.B) {
	db, _ := openTestDB(b)
	h := newTestHub(b, db, Options{})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 100_000 {
		topic := []string{fmt.Sprint("client-chosen-topic-", i)}
		h.clients.opened(topic)
		h.clients.closed(topic)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	ctx := context.Background()
	var topics int
	for b.Loop() {
		st, err := h.Stats(ctx)
		if err != nil {
			b.Fatal(err)
		}
		topics = len(st.Topics)
	}
	b.ReportMetric(float64(topics), "topics")
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB-kept")
}
