package hubtest

import (
	"context"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Retention through the hub: Prune, StartRetention and the head.

// publishThenPruneAll publishes n events to topic on h and then, once the
// clock has moved on, has retention by age delete every event of the log,
// failing the test unless that deletes want events.
func publishThenPruneAll(t testing.TB, h *replayd.EventHub, topic string, n int, want int64) {
	t.Helper()
	var last replayd.Event
	for i := range n {
		last = mustPublish(t, h, topic, i)
	}
	waitClock(t, last.CreatedAt, 20*time.Millisecond)
	if got, err := h.Prune(context.Background(), replayd.RetentionPolicy{MaxAge: 5 * time.Millisecond}); err != nil || got != want {
		t.Fatalf("pruned %d, %v; want %d", got, err, want)
	}
}

func testHeadNeverGoesBackwards(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	ctx := context.Background()
	base := headOf(t, h)
	publishThenPruneAll(t, h, "a", 5, 5)
	head, err := h.LatestSequence(ctx)
	if err != nil || head != base+5 {
		t.Fatalf("head after pruning everything = %d, %v; want %d", head, err, base+5)
	}
	if ev := mustPublish(t, h, "a", 1); ev.Sequence != base+6 {
		t.Fatalf("next sequence %d, want %d", ev.Sequence, base+6)
	}
	// A new hub on the same database starts from the same head, or above
	// it (the sequence floor), never below.
	h2 := open(replayd.Options{})
	if head, _ := h2.LatestSequence(ctx); head < base+6 {
		t.Fatalf("second hub head %d, below %d", head, base+6)
	}
}

func testPruneByAgeBelowOneSecond(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	ctx := context.Background()
	mustPublish(t, h, "a", 1)
	// created_at has millisecond precision: 50ms after this row, a 20ms
	// MaxAge condemns it.
	time.Sleep(50 * time.Millisecond)
	if n, err := h.Prune(ctx, replayd.RetentionPolicy{MaxAge: 20 * time.Millisecond}); err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1", n, err)
	}
}

func testStartRetention(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	ctx := context.Background()
	base := headOf(t, h)
	for i := range 5 {
		mustPublish(t, h, "a", i)
	}
	stop := h.StartRetention(replayd.RetentionPolicy{MaxEvents: 2}, 10*time.Millisecond)
	defer stop()
	wiretest.WaitUntil(t, "first scheduled prune", func() bool {
		evs, _ := h.Replay(ctx, "", 0, 10)
		return len(evs) == 2
	})
	for i := range 3 {
		mustPublish(t, h, "a", i)
	}
	wiretest.WaitUntil(t, "a later scheduled prune", func() bool {
		evs, _ := h.Replay(ctx, "", 0, 10)
		return len(evs) == 2 && evs[1].Sequence == base+8
	})
	stop()
	stop()
}
