package hubtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// In-process subscribers: what Subscribe and SubscribeWithGaps are told.

// subRecorder records what a SubscribeWithGaps subscriber is told, in order:
// "e<seq>" for an event, "gap <reason> <after> <from>-<through>" for a gap.
type subRecorder struct {
	mu    sync.Mutex
	items []string
	seen  chan struct{} // signalled after every item
}

func recordSubscriber(h *replayd.EventHub) *subRecorder {
	r := &subRecorder{seen: make(chan struct{}, 1)}
	h.SubscribeWithGaps(func(ev replayd.Event) {
		r.add(fmt.Sprintf("e%d", ev.Sequence))
	}, func(g replayd.Gap) {
		r.add(fmt.Sprintf("gap %s %d %d-%d", g.Reason, g.After, g.From, g.Through))
	})
	return r
}

func (r *subRecorder) add(s string) {
	r.mu.Lock()
	r.items = append(r.items, s)
	r.mu.Unlock()
	select {
	case r.seen <- struct{}{}:
	default:
	}
}

func (r *subRecorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.items...)
}

// waitFor waits until the recorder holds n items and returns them.
func (r *subRecorder) wait(t testing.TB, n int) []string {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		if got := r.snapshot(); len(got) >= n {
			return got
		}
		select {
		case <-r.seen:
		case <-deadline:
			t.Fatalf("subscriber got %q, want %d items", r.snapshot(), n)
		}
	}
}

// Rows another process committed and retention deleted before this hub
// delivered them live: a SubscribeWithGaps subscriber is told, before the
// next event, instead of skipping them silently.
func testSubscribeGapWhenRowsPrunedBeforeLiveDelivery(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	other := open(replayd.Options{})

	first := mustPublish(t, h, "", "before") // the live position is first
	rec := recordSubscriber(h)
	var plain []int64
	h.Subscribe(func(ev replayd.Event) { plain = append(plain, ev.Sequence) })
	var last replayd.Event
	for range 3 { // committed by "another process"; h has no tail
		last = mustPublish(t, other, "a", "unseen")
	}
	// Once the clock has moved on, retention by age deletes all four.
	waitClock(t, last.CreatedAt, 20*time.Millisecond)
	if n, err := other.Prune(context.Background(), replayd.RetentionPolicy{MaxAge: 5 * time.Millisecond}); err != nil || n != 4 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	ev := mustPublish(t, h, "", "next") // h learns of the hole now
	want := []string{
		fmt.Sprintf("gap pruned %d %d-%d", first.Sequence, first.Sequence+1, first.Sequence+3),
		fmt.Sprintf("e%d", ev.Sequence),
	}
	if got := rec.wait(t, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("subscriber got %q, want %q", got, want)
	}
	// A plain Subscribe still works, without being told.
	if fmt.Sprint(plain) != fmt.Sprint([]int64{ev.Sequence}) {
		t.Fatalf("plain subscriber got %v", plain)
	}
}
