package hubtest

import (
	"fmt"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// In-process subscribers: what Subscribe and SubscribeWithGaps are told.

// recordSubscriber records what a SubscribeWithGaps subscriber of h is
// told, in order: "e<seq>" for an event, "gap <reason> <after>
// <from>-<through>" for a gap.
func recordSubscriber(h *replayd.EventHub) *wiretest.Recorder {
	r := wiretest.NewRecorder()
	h.SubscribeWithGaps(func(ev replayd.Event) { r.Add(fmt.Sprintf("e%d", ev.Sequence)) },
		func(g replayd.Gap) { r.Add(fmt.Sprintf("gap %s %d %d-%d", g.Reason, g.After, g.From, g.Through)) })
	return r
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
	// Three events committed by "another process" (h has no tail), and
	// deleted by retention with the first: four.
	publishThenPruneAll(t, other, "a", 3, 4)
	ev := mustPublish(t, h, "", "next") // h learns of the hole now
	want := []string{
		fmt.Sprintf("gap pruned %d %d-%d", first.Sequence, first.Sequence+1, first.Sequence+3),
		fmt.Sprintf("e%d", ev.Sequence),
	}
	if got := rec.Wait(t, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("subscriber got %q, want %q", got, want)
	}
	// A plain Subscribe still works, without being told.
	if fmt.Sprint(plain) != fmt.Sprint([]int64{ev.Sequence}) {
		t.Fatalf("plain subscriber got %v", plain)
	}
}
