package hubtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// The gap matrix of PROTOCOL.md for replay_limit, in a topic scope and the global
// scope, with other topics interleaved so counting visible rows and
// sequence arithmetic disagree.
func testSSEGapReplayLimit(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 3}})
	srv := serve(t, h)
	// Relative to the head b: 1:a 2:x 3:a 4:bcast 5:x 6:a 7:x 8:a 9:a 10:x
	b := headOf(t, h)
	publishTopics(t, h, "a", "x", "a", "", "x", "a", "x", "a", "a", "x")
	cases := []struct {
		name     string
		url      string
		cursor   int64
		from     int64
		through  int64
		missed   int64
		replayed []string
	}{
		// Visible to a above 1: 3,4,6,8,9. Window 6,8,9; missed 3,4.
		{"topic", "?topic=a", 1, 3, 4, 2, []string{"6", "8", "9"}},
		// Visible above the head b (0 is the same): 1..10. Window 8,9,10; missed 1..7.
		{"global", "", 0, 1, 7, 7, []string{"8", "9", "10"}},
		// Visible to x above 2: 4,5,7,10. Window 5,7,10; missed 4.
		{"topic one missed", "?topic=x", 2, 4, 4, 1, []string{"5", "7", "10"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cur := b + tc.cursor
			if tc.cursor == 0 {
				cur = 0
			}
			c := wiretest.Dial(t, srv.URL+tc.url, wiretest.LastID(cur))
			_, _, cursor, head := c.Hello()
			if cursor != cur || head != b+10 {
				t.Fatalf("hello cursor %d head %d", cursor, head)
			}
			g := wiretest.MustGap(t, c.Next())
			want := gapJSON{Reason: "replay_limit", ResumedFrom: i64p(cur), MissedFrom: i64p(b + tc.from),
				MissedThrough: i64p(b + tc.through), Missed: i64p(tc.missed), ReplayLimit: 3}
			if g.String() != want.String() {
				t.Fatalf("gap %s, want %s", g.String(), want.String())
			}
			if got := wiretest.FrameIDs(c.Events(3)); !slices.Equal(got, relIDs(b, atoi(t, tc.replayed)...)) {
				t.Fatalf("replayed %v, want %v", got, tc.replayed)
			}
		})
	}
	// Exactly at the limit: no gap.
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(b+4))
	c.Hello()
	if got := wiretest.FrameIDs(c.Events(3)); !slices.Equal(got, relIDs(b, 6, 8, 9)) {
		t.Fatalf("at the limit: %v", got)
	}
}

// A negative ReplayLimit replays nothing: any backlog is a gap.
func testSSEGapNegativeReplayLimit(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: -1}})
	srv := serve(t, h)
	b := headOf(t, h)
	publishTopics(t, h, "a", "b", "a")
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0))
	c.Hello()
	g := wiretest.MustGap(t, c.Next())
	want := gapJSON{Reason: "replay_limit", ResumedFrom: i64p(0), MissedFrom: i64p(b + 1), MissedThrough: i64p(b + 3), Missed: i64p(2), ReplayLimit: 0}
	if g.String() != want.String() {
		t.Fatalf("gap %s", g.String())
	}
	// Nothing is replayed, and the missed events never arrive later.
	ev := mustPublish(t, h, "a", "live")
	c.NextIs(ev.Sequence, "after the gap")
	// Caught up: no gap.
	c = wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(ev.Sequence))
	c.Hello()
	ev = mustPublish(t, h, "a", "live")
	c.NextIs(ev.Sequence, "caught up")
}

func testSSEGapPruned(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 2}})
	srv := serve(t, h)
	ctx := context.Background()
	// Relative to the head b: 1:a 2:b 3:a 4:b 5:b 6:b 7:a 8:b 9:b 10:b
	b := headOf(t, h)
	publishTopics(t, h, "a", "b", "a", "b", "b", "b", "a", "b", "b", "b")
	// Delete 1..5: watermarks a=3, b=5.
	if n, err := h.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 5}); err != nil || n != 5 {
		t.Fatalf("prune %d, %v", n, err)
	}
	cases := []struct {
		name     string
		url      string
		cursor   int64
		want     *gapJSON
		replayed []string
	}{
		// a above 1: 3 pruned (P_a=3 > 1); retained 7; window 7. Gap 2..3.
		{"topic pruned", "?topic=a", 1, &gapJSON{Reason: "pruned", ResumedFrom: i64p(1), MissedFrom: i64p(2), MissedThrough: i64p(3), ReplayLimit: 2}, []string{"7"}},
		// a above 3: nothing of a was pruned above 3; b's pruning does not matter.
		{"other topic pruned", "?topic=a", 3, nil, []string{"7"}},
		// b above 4: P_b=5 > 4; retained 6,8,9,10; window 9,10; M = 6,8.
		// missedThrough = max(P, last of M) = 8.
		{"pruned and over the limit", "?topic=b", 4, &gapJSON{Reason: "pruned", ResumedFrom: i64p(4), MissedFrom: i64p(5), MissedThrough: i64p(8), ReplayLimit: 2}, []string{"9", "10"}},
		// Global above 4: any topic's watermark (5) applies.
		{"global", "", 4, &gapJSON{Reason: "pruned", ResumedFrom: i64p(4), MissedFrom: i64p(5), MissedThrough: i64p(8), ReplayLimit: 2}, []string{"9", "10"}},
		// Global above 5: nothing pruned above; over the limit only.
		{"global above watermark", "", 5, &gapJSON{Reason: "replay_limit", ResumedFrom: i64p(5), MissedFrom: i64p(6), MissedThrough: i64p(8), Missed: i64p(3), ReplayLimit: 2}, []string{"9", "10"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := wiretest.Dial(t, srv.URL+tc.url, wiretest.LastID(b+tc.cursor))
			if _, _, cursor, _ := c.Hello(); cursor != b+tc.cursor {
				t.Fatalf("cursor %d", cursor)
			}
			if tc.want != nil {
				want := *tc.want
				for _, p := range []**int64{&want.ResumedFrom, &want.MissedFrom, &want.MissedThrough} {
					*p = i64p(b + **p)
				}
				if g := wiretest.MustGap(t, c.Next()); g.String() != want.String() {
					t.Fatalf("gap %s, want %s", g.String(), want.String())
				}
			}
			if got := wiretest.FrameIDs(c.Events(len(tc.replayed))); !slices.Equal(got, relIDs(b, atoi(t, tc.replayed)...)) {
				t.Fatalf("replayed %v, want %v", got, tc.replayed)
			}
		})
	}
	// Broadcasts' watermark applies to every topic.
	mustPublish(t, h, "", "bcast") // 11
	mustPublish(t, h, "c", "c")    // 12
	if _, err := h.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 1}); err != nil {
		t.Fatal(err)
	}
	c := wiretest.Dial(t, srv.URL+"?topic=c", wiretest.LastID(b+10))
	c.Hello()
	g := wiretest.MustGap(t, c.Next())
	if g.Reason != "pruned" || *g.MissedFrom != b+11 || *g.MissedThrough != b+11 || g.Missed != nil {
		t.Fatalf("gap %s", g.String())
	}
}

// A cursor above the head (the log was reset) is an unknown_cursor gap; the
// client is then fresh from the head and gets live events at once.
func testSSEGapUnknownCursor(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	ev1 := mustPublish(t, h, "a", 1)
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(ev1.Sequence+1000))
	f, _, cursor, head := c.Hello()
	if cursor != ev1.Sequence || head != ev1.Sequence || f.ID != fmt.Sprint(ev1.Sequence) {
		t.Fatalf("hello %+v", f)
	}
	g := wiretest.MustGap(t, c.Next())
	if want := (gapJSON{Reason: "unknown_cursor", ResumedFrom: i64p(ev1.Sequence + 1000), ReplayLimit: 100}); g.String() != want.String() {
		t.Fatalf("gap %s", g.String())
	}
	ev := mustPublish(t, h, "a", 2)
	c.NextIs(ev.Sequence, "not live from the head")
}

func testSSEGapInvalidCursor(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: -5}})
	srv := serve(t, h)
	mustPublish(t, h, "a", 1)
	for _, bad := range []string{"abc", "-1", "1.5", "+1", " 1", "1 ", "1e3", "0x10", "9223372036854775808", "99999999999999999999"} {
		t.Run(bad, func(t *testing.T) {
			// Header values cannot hold every byte; the query parameter
			// carries the same cursor rules.
			head, _ := h.LatestSequence(context.Background())
			c := wiretest.Dial(t, srv.URL+"?topic=a&lastEventId="+url.QueryEscape(bad), nil)
			if _, _, cursor, _ := c.Hello(); cursor != head {
				t.Fatalf("cursor %d, want the head %d", cursor, head)
			}
			g := wiretest.MustGap(t, c.Next())
			if want := (gapJSON{Reason: "invalid_cursor", ReplayLimit: 0}); g.String() != want.String() {
				t.Fatalf("gap %s", g.String())
			}
			ev := mustPublish(t, h, "a", 2)
			c.NextIs(ev.Sequence, "not live")
		})
	}
	// The largest valid cursor is valid, and above the head.
	c := wiretest.Dial(t, srv.URL+"?topic=a", http.Header{"Last-Event-ID": {"9223372036854775807"}})
	c.Hello()
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "unknown_cursor" {
		t.Fatalf("gap %s", g.String())
	}
}

// Rows another process committed and retention deleted before this hub
// could deliver them live cannot be delivered: the hub ends its streams so
// that their clients reconnect and get a gap, instead of a silent hole.
func testSSEResyncWhenRowsPrunedBeforeLiveDelivery(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	other := open(replayd.Options{})

	c := wiretest.Dial(t, srv.URL, nil)
	_, _, cursor, _ := c.Hello()
	// Three events committed by "another process" (h has no tail), and
	// deleted by retention, all three.
	publishThenPruneAll(t, other, "", 3, 3)
	ev := mustPublish(t, h, "", "next") // h learns of the gap now
	if f, err := c.NextErr(waitFor); err == nil {
		t.Fatalf("stream went on with %+v (the next event is %d): a silent hole", f, ev.Sequence)
	} else if errors.Is(err, wiretest.ErrTimeout) {
		t.Fatal("stream neither ended nor delivered")
	}
	// Reconnecting from the last id it saw, the client is told.
	c = wiretest.Dial(t, srv.URL, wiretest.LastID(cursor))
	c.Hello()
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "pruned" || *g.MissedFrom != cursor+1 || *g.MissedThrough != cursor+3 {
		t.Fatalf("gap %s", g.String())
	}
	c.NextIs(ev.Sequence, "after the gap")
}
