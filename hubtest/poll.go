package hubtest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// End-to-end tests of the poll endpoint (PollHandler) over real HTTP.

func mustAtoi(t testing.TB, s string) int64 {
	t.Helper()
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func testPollAnswerShapeAndHeaders(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	a := mustPublish(t, h, "a", map[string]any{"n": 1, "text": "line one\nline two"})
	b := mustPublish(t, h, "", []int{1, 2})
	o := mustPublish(t, h, "other", 3)

	status, hdr, body := wiretest.GetPoll(t, base, "topic=a&cursor=0")
	if status != 200 || hdr.Get("Content-Type") != "application/json" || hdr.Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v", status, hdr)
	}
	want := fmt.Sprintf(`{"topics":["a"],"cursor":%d,"head":%d,"more":false,"gap":null,"events":[`+
		`{"id":%d,"type":"message","topic":"a","data":%s},{"id":%d,"type":"message","topic":null,"data":%s}]}`,
		b.Sequence, o.Sequence, a.Sequence, a.Payload, b.Sequence, b.Payload)
	if string(body) != want {
		t.Fatalf("answer\n%s\nwant\n%s", body, want)
	}
	// Global scope: topics is [], every event.
	p := wiretest.Poll(t, base, "cursor=0")
	if p.Topics == nil || len(p.Topics) != 0 || len(p.Events) != 3 {
		t.Fatalf("global: %+v", p)
	}
	// Several topics, in the order first requested, each once.
	p = wiretest.Poll(t, base, "topic=other&topic=a&topic=other&topic=+&cursor=0")
	if !slices.Equal(p.Topics, []string{"other", "a"}) || len(p.Events) != 3 {
		t.Fatalf("several topics: %+v", p)
	}
}

func testPollFreshRequest(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	b := headOf(t, h)
	for range 3 {
		mustPublish(t, h, "a", 1)
	}
	// Pruned history is no gap for a fresh client.
	if _, err := h.Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 1}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"topic=a", "topic=a&cursor=", "topic=a&cursor=&limit=&wait="} {
		p := wiretest.Poll(t, base, q)
		if p.Cursor != b+3 || p.Head != b+3 || p.Gap != nil || len(p.Events) != 0 || p.More {
			t.Fatalf("%q: %+v", q, p)
		}
	}
}

func testPollBadParameters(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	for _, q := range []string{
		"cursor=x", "cursor=-1", "cursor=1.5", "cursor=18446744073709551616",
		"limit=0", "limit=-1", "limit=1.0", "limit=x",
		"wait=-1", "wait=1e3", "wait=Inf", "wait=+1", "wait=.", "wait=1.2.3",
		"topic=a;b", "topic=%00", "topic=" + strings.Repeat("x", 300),
		// Given more than once, a parameter is malformed unless every
		// value is well-formed and the same (issue 17, row 5).
		"cursor=5&cursor=abc", "limit=1&limit=abc", "wait=1&wait=x", "cursor=abc&cursor=5",
		"cursor=1&cursor=2", "limit=1&limit=2", "cursor=1&cursor=",
	} {
		status, _, body := wiretest.GetPoll(t, base, q)
		if status != http.StatusBadRequest {
			t.Errorf("%q: %d %s, want 400", q, status, body)
		}
	}
	if p := wiretest.Poll(t, base, "cursor=0&cursor=0&limit=3&limit=3&wait=0&wait=0"); p.Cursor != 0 || p.Gap != nil {
		t.Errorf("the same values repeated: %+v", p)
	}
	// Methods.
	for _, m := range []string{"POST", "PUT", "DELETE", "HEAD"} {
		req, _ := http.NewRequest(m, base+"/poll", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, OPTIONS" {
			t.Errorf("%s: %d Allow %q", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

func testPollPagingAndClamping(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{Poll: replayd.PollOptions{MaxLimit: 7}})
	base := wiretest.ServePoll(t, h)
	var want []int64
	for i := range 40 {
		topic := []string{"a", "b", ""}[i%3]
		ev := mustPublish(t, h, topic, i)
		if topic != "b" {
			want = append(want, ev.Sequence)
		}
	}
	// A limit above MaxLimit is lowered to it; pages come oldest first, and
	// more says whether another page is there. No replay_limit gap, ever.
	var got []int64
	cursor := int64(0)
	for pages := 0; ; pages++ {
		p := wiretest.Poll(t, base, fmt.Sprintf("topic=a&cursor=%d&limit=99999999999999999999", cursor))
		if p.Gap != nil {
			t.Fatalf("page %d: gap %s", pages, p.Gap.String())
		}
		if len(p.Events) > 7 {
			t.Fatalf("page of %d events", len(p.Events))
		}
		got = append(got, p.IDs()...)
		if len(p.Events) > 0 && p.Cursor != p.Events[len(p.Events)-1].ID {
			t.Fatalf("cursor %d after %v", p.Cursor, p.IDs())
		}
		if !p.More {
			if p.Cursor != want[len(want)-1] {
				t.Fatalf("last cursor %d", p.Cursor)
			}
			break
		}
		cursor = p.Cursor
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paged %v, want %v", got, want)
	}
	// The default limit is 100, under MaxLimit only if MaxLimit is higher.
	if p := wiretest.Poll(t, base, "cursor=0"); len(p.Events) != 7 || !p.More {
		t.Fatalf("default limit with MaxLimit 7: %d events, more %v", len(p.Events), p.More)
	}
}

// testPollPrunedGapAlone: a scope whose every event above the cursor was
// pruned gets its pruned gap once, with the cursor moved past the gap's
// range; the long poll sent back from there is held, not answered the same
// gap again at once (which would make a client poll in a hot loop).
func testPollPrunedGapAlone(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	b := headOf(t, h)
	for i := range 6 {
		mustPublish(t, h, []string{"a", "b"}[i/3], i) // 1..6: a a a b b b
	}
	if _, err := h.Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 3}); err != nil {
		t.Fatal(err) // deletes 1..3, every event of a
	}
	p := wiretest.Poll(t, base, fmt.Sprintf("topic=a&cursor=%d&wait=5", b))
	if p.Gap == nil || p.Gap.Reason != "pruned" || *p.Gap.MissedThrough != b+3 || len(p.Events) != 0 {
		t.Fatalf("a, all pruned: %+v", p)
	}
	if p.Cursor != b+3 {
		t.Fatalf("a pruned gap alone left the cursor at %d, want the gap's missedThrough %d", p.Cursor, b+3)
	}
	start := time.Now()
	again := wiretest.Poll(t, base, fmt.Sprintf("topic=a&cursor=%d&wait=0.3", p.Cursor))
	if again.Gap != nil || len(again.Events) != 0 || again.Cursor != b+3 {
		t.Fatalf("the poll sent back after the gap: %+v", again)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("the poll sent back after the gap was answered after %v, not held", waited)
	}
}

func testPollGaps(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	b := headOf(t, h) // sequences below are relative to it
	for i := range 6 {
		mustPublish(t, h, []string{"a", "b"}[i%2], i) // 1..6: a b a b a b
	}
	if _, err := h.Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 3}); err != nil {
		t.Fatal(err) // deletes 1..3: watermarks a=3, b=2
	}
	p := wiretest.Poll(t, base, fmt.Sprintf("topic=a&cursor=%d&limit=5", b+1))
	if p.Gap == nil || p.Gap.Reason != "pruned" || *p.Gap.ResumedFrom != b+1 || *p.Gap.MissedFrom != b+2 ||
		*p.Gap.MissedThrough != b+3 || p.Gap.Missed != nil || p.Gap.ReplayLimit != 5 {
		t.Fatalf("pruned: %+v", p)
	}
	if !slices.Equal(p.IDs(), rel(b, 5)) || p.Cursor != b+5 {
		t.Fatalf("after the pruned gap: %v cursor %d", p.IDs(), p.Cursor)
	}
	// At the watermark: no gap.
	if p := wiretest.Poll(t, base, fmt.Sprintf("topic=a&cursor=%d", b+3)); p.Gap != nil || !slices.Equal(p.IDs(), rel(b, 5)) {
		t.Fatalf("at the watermark: %+v", p)
	}
	// b's watermark is 2: cursor 2 is clean for b, not for the scope a+b.
	if p := wiretest.Poll(t, base, fmt.Sprintf("topic=b&cursor=%d", b+2)); p.Gap != nil {
		t.Fatalf("b at its watermark: %+v", p)
	}
	if p := wiretest.Poll(t, base, fmt.Sprintf("topic=b&topic=a&cursor=%d", b+2)); p.Gap == nil || *p.Gap.MissedThrough != b+3 {
		t.Fatalf("a+b below a's watermark: %+v", p)
	}
	// Above the head: unknown_cursor, the cursor set to the head, no events,
	// even with a wait.
	start := time.Now()
	p = wiretest.Poll(t, base, fmt.Sprintf("topic=a&cursor=%d&wait=5", b+50))
	if p.Gap == nil || p.Gap.Reason != "unknown_cursor" || *p.Gap.ResumedFrom != b+50 || p.Gap.MissedFrom != nil ||
		p.Gap.MissedThrough != nil || p.Gap.Missed != nil || p.Cursor != b+6 || p.Head != b+6 || len(p.Events) != 0 {
		t.Fatalf("unknown cursor: %+v", p)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("an unknown cursor was held %v", time.Since(start))
	}
}

// The two transports share one cursor: an SSE client's last id is a poll
// cursor, and a poll's cursor is an SSE Last-Event-ID, with nothing lost
// or repeated either way.
func testPollAndSSEShareTheCursor(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	base := wiretest.ServePoll(t, h)
	var all []int64
	pub := func(n int) {
		for i := range n {
			ev := mustPublish(t, h, []string{"a", "", "z"}[i%3], i)
			if ev.Topic != "z" {
				all = append(all, ev.Sequence)
			}
		}
	}
	pub(5)
	c := wiretest.Dial(t, base+"/events?topic=a", wiretest.LastID(0))
	c.Hello()
	var got []int64
	for _, f := range c.Events(len(all)) {
		got = append(got, mustAtoi(t, f.ID))
	}
	c.Close()
	pub(6)
	p := wiretest.Poll(t, base, fmt.Sprintf("topic=a&cursor=%d&limit=2", got[len(got)-1]))
	got = append(got, p.IDs()...)
	pub(3)
	c = wiretest.Dial(t, base+"/events?topic=a", wiretest.LastID(p.Cursor))
	c.Hello()
	for _, f := range c.Events(len(all) - len(got)) {
		got = append(got, mustAtoi(t, f.ID))
	}
	if !slices.Equal(got, all) {
		t.Fatalf("SSE, poll, SSE: %v, want %v", got, all)
	}
}
