package replayd

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// subRecorder records what a SubscribeWithGaps subscriber is told, in order:
// "e<seq>" for an event, "gap <reason> <after> <from>-<through>" for a gap.
type subRecorder struct {
	mu    sync.Mutex
	items []string
	seen  chan struct{} // signalled after every item
}

func recordSubscriber(h *EventHub) *subRecorder {
	r := &subRecorder{seen: make(chan struct{}, 1)}
	h.SubscribeWithGaps(func(ev Event) {
		r.add(fmt.Sprintf("e%d", ev.Sequence))
	}, func(g Gap) {
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
func TestSubscribeGapWhenRowsPrunedBeforeLiveDelivery(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	db2, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	other := newTestHub(t, db2, Options{})

	first := mustPublish(t, h, "", "before") // the live position is first
	rec := recordSubscriber(h)
	var plain []int64
	h.Subscribe(func(ev Event) { plain = append(plain, ev.Sequence) })
	for range 3 { // committed by "another process"; h has no tail
		mustPublish(t, other, "a", "unseen")
	}
	if _, err := db.Exec(`UPDATE events SET created_at = created_at - 60000`); err != nil {
		t.Fatal(err)
	}
	if n, err := other.Prune(context.Background(), RetentionPolicy{MaxAge: time.Second}); err != nil || n != 4 {
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
