package live

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/replayd/replayd/storage"
)

// The wire drops a repeat by its sequence anyway; the queue must not even
// hold it, or it would count twice against MaxBufferedBytes.
func TestDispatchOverlapQueuedOnce(t *testing.T) {
	l := New(Config{})
	s := NewStream([]string{"a", "b", "c"}, nil, -1)
	other := NewStream([]string{"b"}, nil, -1)
	l.AddStream(s)
	l.AddStream(other)
	l.mu.Lock()
	l.dispatch([]storage.Event{{Sequence: 1}, {Sequence: 2, Topic: "b"}, {Sequence: 3, Topic: "d"}, {Sequence: 4}})
	l.mu.Unlock()
	for _, c := range []struct {
		s    *Stream
		want []int64
	}{{s, []int64{1, 2, 4}}, {other, []int64{1, 2, 4}}} {
		q, _ := c.s.Take()
		var got []int64
		for _, le := range q {
			got = append(got, le.Sequence)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("stream %v queued %v, want %v", c.s.topics, got, c.want)
		}
	}
	l.RemoveStream(s)
	l.RemoveStream(other)
	if len(l.byTopic) != 0 {
		t.Fatalf("sets left after removing every stream: %v", l.byTopic)
	}
}

// benchPayload is the root benchmarks' typical payload: ~200 bytes of JSON.
var benchPayload = []byte(`{"kind":"order.updated","order":{"id":"ord_5f2a9c1e","status":"shipped","carrier":"ups","items":3,"total_cents":129900},"note":"` + strings.Repeat("x", 64) + `"}`)

// benchReportRate reports n events over the benchmark's elapsed time.
func benchReportRate(b *testing.B, n int, unit string) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(n)/s, unit)
	}
}

// BenchmarkDispatch hands one event to 1,000 live subscribers: SSE streams
// of the event's topic, streams spread over 100 topics receiving a
// broadcast, or Subscribe callbacks. It times the writer goroutine's part
// (frame encoding once, one queue push per stream); the streams' queues are
// drained off the clock.
func BenchmarkDispatch(b *testing.B) {
	const subscribers = 1000
	cases := []struct {
		name   string
		topics int    // streams are spread over this many topics; 0: callbacks
		topic  string // the event's topic
		per    int    // topics each stream holds (default 1)
	}{
		{"streams/one-topic", 1, "topic-00", 1},
		{"streams/broadcast-100-topics", 100, "", 1},
		// Each stream holds 4 of 100 topics; every stream holds topic-00.
		{"streams/4-topics-each/topic-event", 100, "topic-00", 4},
		{"streams/4-topics-each/broadcast", 100, "", 4},
		{"funcs", 0, "topic-00", 1},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			l := New(Config{})
			var streams []*Stream
			var calls atomic.Int64
			for i := range subscribers {
				if c.topics == 0 {
					defer l.Subscribe(func(storage.Event) { calls.Add(1) }, nil)()
					continue
				}
				topics := []string{fmt.Sprintf("topic-%02d", i%c.topics)}
				if c.per > 1 {
					topics = []string{"topic-00"}
					for k := 1; k < c.per; k++ {
						topics = append(topics, fmt.Sprintf("topic-%02d", 1+(i*(c.per-1)+k)%(c.topics-1)))
					}
				}
				s := NewStream(topics, nil, -1)
				l.AddStream(s)
				streams = append(streams, s)
			}
			drain := func() {
				for _, s := range streams {
					if q, _ := s.Take(); len(q) > 0 {
						s.Release(q)
					}
					select {
					case <-s.wake:
					default:
					}
				}
			}
			ev := storage.Event{Type: "message", Topic: c.topic, Payload: benchPayload}
			rows := []storage.Event{ev}
			b.ReportAllocs()
			b.ResetTimer()
			l.mu.Lock()
			for i := 0; i < b.N; i++ {
				rows[0].Sequence = int64(i + 1)
				l.dispatch(rows)
				if i%256 == 255 {
					b.StopTimer()
					drain()
					b.StartTimer()
				}
			}
			l.mu.Unlock()
			b.StopTimer()
			drain()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/subscribers, "ns/delivery")
			benchReportRate(b, b.N*subscribers, "deliveries/s")
		})
	}
}
