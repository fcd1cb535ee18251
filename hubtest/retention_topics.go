package hubtest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Retention per topic (SPEC §21): a scope over topics pruned differently
// gets a pruned gap naming exactly the range where it lost events, then
// every event the log kept above the cursor, inside that range too, over
// SSE and poll alike.
func testTopicRetentionMixedScopeGaps(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 100}})
	srv := serve(t, h)
	base := wiretest.ServePoll(t, h)
	ctx := context.Background()
	// Relative to the head b: 1:a 2:b 3:a 4:b ... 19:a 20:b.
	b := headOf(t, h)
	for i := range 20 {
		mustPublish(t, h, []string{"a", "b"}[i%2], i)
	}
	// a keeps its newest 2 (17, 19): 1..15 of a are deleted, a's
	// watermark is 15; b (and broadcasts: the default) keep everything.
	policy := replayd.RetentionPolicy{Topics: []replayd.TopicPolicy{{Topic: "a", MaxEvents: 2}}}
	if n, err := h.Prune(ctx, policy); err != nil || n != 8 {
		t.Fatalf("prune %+v: %d, %v; want 8", policy, n, err)
	}
	evens := func(from int64) []int64 {
		var out []int64
		for i := from; i <= 20; i += 2 {
			out = append(out, i)
		}
		return out
	}
	pruned := func(cursor, through int64, limit int) *gapJSON {
		return &gapJSON{Reason: "pruned", ResumedFrom: i64p(b + cursor), MissedFrom: i64p(b + cursor + 1), MissedThrough: i64p(b + through), ReplayLimit: limit}
	}
	cases := []struct {
		name   string
		h      *replayd.EventHub
		url    string
		cursor int64
		want   *gapJSON
		events []int64
	}{
		// a+b above 4: a lost 5..15, b kept 6..14 inside that range.
		{"mixed scope", h, "?topic=a&topic=b", 4, pruned(4, 15, 100), []int64{6, 8, 10, 12, 14, 16, 17, 18, 19, 20}},
		{"mixed scope, topics the other way", h, "?topic=b&topic=a", 4, pruned(4, 15, 100), []int64{6, 8, 10, 12, 14, 16, 17, 18, 19, 20}},
		// b alone lost nothing.
		{"topic never pruned", h, "?topic=b", 4, nil, evens(6)},
		{"pruned topic", h, "?topic=a", 4, pruned(4, 15, 100), []int64{17, 19}},
		// At a's watermark nothing of the scope above was lost.
		{"mixed scope at the watermark", h, "?topic=a&topic=b", 15, nil, []int64{16, 17, 18, 19, 20}},
		{"global", h, "", 4, pruned(4, 15, 100), []int64{6, 8, 10, 12, 14, 16, 17, 18, 19, 20}},
		// A replay limit of 3: the window is 18..20, the skipped retained
		// events end at 17, past the watermark.
		{"mixed scope over the limit", open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 3}}), "?topic=a&topic=b", 4, pruned(4, 17, 3), []int64{18, 19, 20}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := srv
			if tc.h != h {
				s = serve(t, tc.h)
			}
			c := wiretest.Dial(t, s.URL+tc.url, wiretest.LastID(b+tc.cursor))
			if _, _, cursor, _ := c.Hello(); cursor != b+tc.cursor {
				t.Fatalf("cursor %d", cursor)
			}
			if tc.want != nil {
				if g := wiretest.MustGap(t, c.Next()); g.String() != tc.want.String() {
					t.Fatalf("gap %s, want %s", g.String(), tc.want.String())
				}
			}
			want := relIDs(b, tc.events...)
			if got := wiretest.FrameIDs(c.Events(len(want))); !slices.Equal(got, want) {
				t.Fatalf("replayed %v, want %v", got, want)
			}
		})
	}
	// Poll: the same gap, then the retained events, paged.
	p := wiretest.Poll(t, base, fmt.Sprintf("topic=a&topic=b&cursor=%d&limit=4", b+4))
	if g := pruned(4, 15, 4); p.Gap == nil || p.Gap.String() != g.String() || !slices.Equal(p.IDs(), rel(b, 6, 8, 10, 12)) || !p.More {
		t.Fatalf("poll a+b from 4: %+v; want gap %s and 6, 8, 10, 12", p, g.String())
	}
	// PruneTopic, the primitive: b up to 10.
	if n, err := h.PruneTopic(ctx, "b", b+10); err != nil || n != 5 {
		t.Fatalf("PruneTopic b through %d: %d, %v; want 5", b+10, n, err)
	}
	c := wiretest.Dial(t, srv.URL+"?topic=b", wiretest.LastID(b+4))
	c.Hello()
	if g, want := wiretest.MustGap(t, c.Next()), pruned(4, 10, 100); g.String() != want.String() {
		t.Fatalf("b after PruneTopic: gap %s, want %s", g.String(), want.String())
	}
	want := relIDs(b, evens(12)...)
	if got := wiretest.FrameIDs(c.Events(len(want))); !slices.Equal(got, want) {
		t.Fatalf("b after PruneTopic: replayed %v, want %v", got, want)
	}
	// Then live: nothing more of the replay.
	live := mustPublish(t, h, "b", "live")
	c.NextIs(live.Sequence, "live")
}

// A per-topic prune that overtakes live delivery (rows another process
// committed, deleted before this hub read them) is a gap for subscribers,
// and the rows of topics it kept inside the hole are still delivered, after
// it.
func testTopicRetentionPrunedBeforeLiveDelivery(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	other := open(replayd.Options{})
	first := mustPublish(t, h, "", "before") // the live position is first
	rec := recordSubscriber(h)
	mustPublish(t, other, "a", 1) // by "another process": h has no tail
	b1 := mustPublish(t, other, "b", 1)
	a2 := mustPublish(t, other, "a", 2)
	if n, err := other.PruneTopic(context.Background(), "a", a2.Sequence); err != nil || n != 2 {
		t.Fatalf("PruneTopic a: %d, %v", n, err)
	}
	ev := mustPublish(t, h, "", "next") // h learns of the hole now
	want := []string{
		fmt.Sprintf("gap pruned %d %d-%d", first.Sequence, first.Sequence+1, a2.Sequence),
		fmt.Sprintf("e%d", b1.Sequence),
		fmt.Sprintf("e%d", ev.Sequence),
	}
	if got := rec.Wait(t, 3); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("subscriber got %q, want %q", got, want)
	}
}
