package replayd

import (
	"fmt"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// A replay whose window begins inside its pruned gap's range (topics
// pruned apart) reads pages below the scope's watermark: that is no news,
// and the stream goes on over every page; a prune between pages that
// raises the watermark past the gap's range ends it, and the reconnect
// gets a pruned gap naming the new loss.
func TestReplayTopicPrunedBetweenPages(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{ReplayLimit: 1000}})
	b := mustPublish(t, h, "a", 0).Sequence - 1 // sequences below are relative to b: odd a, even b
	for i := 2; i <= 200; i++ {
		mustPublish(t, h, []string{"a", "b"}[(i-1)%2], i)
	}
	// a keeps its newest 10 (181..199): its watermark is 179.
	if n, err := h.Prune(t.Context(), RetentionPolicy{Topics: []TopicPolicy{{Topic: "a", MaxEvents: 10}}}); err != nil || n != 90 {
		t.Fatalf("prune a: %d, %v", n, err)
	}
	var want []int64 // the scope's retained events
	for i := int64(2); i <= 200; i++ {
		if i%2 == 0 || i > 180 {
			want = append(want, b+i)
		}
	}
	srv := serve(t, h)
	// Nothing more pruned: every page is replayed (two of them lie below
	// the watermark).
	c := wiretest.Dial(t, srv.URL+"?topic=a&topic=b", wiretest.LastID(b))
	c.Hello()
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "pruned" || *g.MissedFrom != b+1 || *g.MissedThrough != b+179 {
		t.Fatalf("gap %s", g.String())
	}
	for _, seq := range want {
		c.NextIs(seq, "replayed")
	}
	live := mustPublish(t, h, "b", "live")
	c.NextIs(live.Sequence, "live")

	// b pruned past the gap's range between two pages: the stream ends.
	h.testHookReplayPage = func(last int64) {
		if last == want[63] {
			if _, err := h.PruneTopic(t.Context(), "b", b+190); err != nil {
				t.Error(err)
			}
		}
	}
	c2 := wiretest.Dial(t, srv.URL+"?topic=a&topic=b", wiretest.LastID(b))
	c2.Hello()
	wiretest.MustGap(t, c2.Next())
	for _, seq := range want[:64] {
		c2.NextIs(seq, "replayed")
	}
	if f, err := c2.NextErr(waitFor); err == nil {
		t.Fatalf("after b was pruned past the gap mid-replay the stream went on with %+v", f)
	} else if err == wiretest.ErrTimeout {
		t.Fatal("the stream neither ended nor went on")
	}
	h.testHookReplayPage = nil
	c3 := wiretest.Dial(t, srv.URL+"?topic=a&topic=b", wiretest.LastID(want[63]))
	c3.Hello()
	if g := wiretest.MustGap(t, c3.Next()); g.Reason != "pruned" || *g.MissedFrom != want[63]+1 || *g.MissedThrough != b+190 {
		t.Fatalf("reconnect gap %s, want pruned %d..%d", g.String(), want[63]+1, b+190)
	}
	for _, seq := range []int64{181, 183, 185, 187, 189, 191, 192, 193} {
		c3.NextIs(b+seq, fmt.Sprintf("replayed after the reconnect (%d)", seq))
	}
}
