package replayd

import (
	"fmt"
	"testing"
)

// The wire drops a repeat by its sequence anyway; the queue must not even
// hold it, or it would count twice against MaxBufferedBytes.
func TestDispatchOverlapQueuedOnce(t *testing.T) {
	var l live
	l.init()
	s := &stream{m: new(metrics), topics: []string{"a", "b", "c"}, max: -1, wake: make(chan struct{}, 1)}
	other := &stream{m: new(metrics), topics: []string{"b"}, max: -1, wake: make(chan struct{}, 1)}
	l.addStream(s)
	l.addStream(other)
	l.mu.Lock()
	l.dispatch([]Event{{Sequence: 1}, {Sequence: 2, Topic: "b"}, {Sequence: 3, Topic: "d"}, {Sequence: 4}})
	l.mu.Unlock()
	for _, c := range []struct {
		s    *stream
		want []int64
	}{{s, []int64{1, 2, 4}}, {other, []int64{1, 2, 4}}} {
		q, _ := c.s.take()
		var got []int64
		for _, le := range q {
			got = append(got, le.Sequence)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("stream %v queued %v, want %v", c.s.topics, got, c.want)
		}
	}
	l.removeStream(s)
	l.removeStream(other)
	if len(l.byTopic) != 0 {
		t.Fatalf("sets left after removing every stream: %v", l.byTopic)
	}
}
