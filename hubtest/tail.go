package hubtest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Rows another hub (another process or node) appended: delivered
// through the tail, or caught up at the next publish.

// A second hub on the same file (as another process would be) publishes;
// the tailing hub delivers every row exactly once and in order, its own
// publishes included.
func testTailDeliversOtherWritersExactlyOnce(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	server := open(replayd.Options{})
	worker := open(replayd.Options{})

	seen := recordLive(t, server)
	// Written before StartTail: still delivered, since the hub's live
	// position predates them.
	early := mustPublish(t, worker, "a", "early")
	stop, err := server.StartTail(time.Millisecond, replayd.TailOptions{MaxInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := server.StartTail(time.Millisecond, replayd.TailOptions{}); !errors.Is(err, replayd.ErrAlreadyTailing) {
		t.Fatalf("second StartTail: %v", err)
	}
	var want []int64
	want = append(want, early.Sequence)
	var wg sync.WaitGroup
	var wmu sync.Mutex
	for _, h := range []*replayd.EventHub{server, worker} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				ev, err := h.Publish(context.Background(), "a", i)
				if err != nil {
					t.Error(err)
					return
				}
				wmu.Lock()
				want = append(want, ev.Sequence)
				wmu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(want)
	wiretest.WaitUntil(t, "tail to deliver everything", func() bool { return len(seen()) >= len(want) })
	if got := seen(); !slices.Equal(got, want) {
		t.Fatalf("delivered %d events, want %d; in order and exactly once: %v", len(got), len(want), slices.IsSorted(got))
	}
	stop()
	stop()
	// After stop, tailing may start again.
	stop2, err := server.StartTail(time.Millisecond, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stop2()
}

// Without a tail, a hub that publishes learns of other writers' rows at its
// next publish and delivers them first, in order.
func testPublishCatchesUpOtherWriters(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	other := open(replayd.Options{})
	base := headOf(t, other)
	seen := recordLive(t, h)
	mustPublish(t, h, "a", 1)
	mustPublish(t, other, "b", 2)
	mustPublish(t, other, "", 3)
	mustPublish(t, h, "a", 4)
	if got := seen(); !slices.Equal(got, rel(base, 1, 2, 3, 4)) {
		t.Fatalf("delivered %v", got)
	}
}
