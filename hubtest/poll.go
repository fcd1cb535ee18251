package hubtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
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

func testPollLongPollWokenByPublish(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	head := mustPublish(t, h, "a", 0).Sequence

	type result struct {
		p   wiretest.PollAnswer
		err error
	}
	ask := func(query string) chan result {
		ch := make(chan result, 1)
		go func() {
			status, _, body := wiretest.GetPoll(t, base, query)
			var p wiretest.PollAnswer
			err := json.Unmarshal(body, &p)
			if status != 200 && err == nil {
				err = fmt.Errorf("status %d", status)
			}
			ch <- result{p, err}
		}()
		return ch
	}
	waitWaiters := func(n int) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for h.Metrics().PollConnections != int64(n) {
			if time.Now().After(deadline) {
				t.Fatalf("%d polls waiting, want %d", h.Metrics().PollConnections, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	onA := ask(fmt.Sprintf("topic=a&cursor=%d&wait=20", head))
	fresh := ask("topic=a&wait=20")
	onB := ask(fmt.Sprintf("topic=b&cursor=%d&wait=0.3", head))
	waitWaiters(3)
	// An event of another topic wakes neither a-poll; b's wait runs out.
	mustPublish(t, h, "c", "invisible")
	r := <-onB
	if r.err != nil || len(r.p.Events) != 0 || r.p.Cursor != head || r.p.Gap != nil {
		t.Fatalf("b timed out with %+v %v", r.p, r.err)
	}
	select {
	case r := <-onA:
		t.Fatalf("woken by another topic's event: %+v", r.p)
	default:
	}
	ev := mustPublish(t, h, "a", "wake")
	for _, ch := range []chan result{onA, fresh} {
		r := <-ch
		if r.err != nil || !slices.Equal(r.p.IDs(), []int64{ev.Sequence}) || r.p.Cursor != ev.Sequence {
			t.Fatalf("woken poll: %+v %v", r.p, r.err)
		}
	}
	waitWaiters(0)
	// A broadcast wakes a topic's poll.
	onA = ask(fmt.Sprintf("topic=a&cursor=%d&wait=20", ev.Sequence))
	waitWaiters(1)
	bc := mustPublish(t, h, "", "broadcast")
	if r := <-onA; r.err != nil || !slices.Equal(r.p.IDs(), []int64{bc.Sequence}) {
		t.Fatalf("broadcast: %+v %v", r.p, r.err)
	}
}

func testPollCloseAnswersWaitingPolls(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	const n = 20
	done := make(chan wiretest.PollAnswer, n)
	for i := range n {
		go func() { done <- wiretest.Poll(t, base, fmt.Sprintf("topic=t%d&cursor=0&wait=30", i%3)) }()
	}
	deadline := time.Now().Add(waitFor)
	for h.Metrics().PollConnections != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d polls waiting", h.Metrics().PollConnections)
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	h.Close()
	for range n {
		select {
		case p := <-done:
			if len(p.Events) != 0 {
				t.Fatalf("answered %+v", p)
			}
		case <-time.After(waitFor):
			t.Fatal("a waiting poll was not answered after Close")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close answered the polls in %v", d)
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

// A waiting long poll is woken by another hub's row, through the tail:
// the hub of another process or node on the same log. (The root package's
// TestPollLongPollWokenThroughTail has the row come from a real second
// process on SQLite.)
func testPollLongPollWokenThroughTailFromAnotherHub(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	stop, err := h.StartTail(10*time.Millisecond, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	base := wiretest.ServePoll(t, h)
	answer := wiretest.PollLater(t, base, "topic=a&cursor=0&wait=20")
	wiretest.WaitUntil(t, "the poll to wait", func() bool { return h.Metrics().PollConnections == 1 })
	other := open(replayd.Options{})
	mustPublish(t, other, "a", "from the other hub", replayd.WithEventID("other"))
	// Not woken by the other hub's row, the poll would wait its 20 s.
	if p := answer(); len(p.Events) != 1 || string(p.Events[0].Data) != `"from the other hub"` {
		t.Fatalf("woken with %+v", p)
	}
}

// Consecutive polls that pass the cursor back, while several goroutines
// publish to several topics and retention prunes: every event of the scope
// above the first cursor arrives once and in order, or inside a gap's range.
func testPollRandomized(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	topics := []string{"a", "b", "c", ""}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ledgerMu sync.Mutex
	ledger := map[int64]string{} // every acknowledged event's topic
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(10+p)))
			for i := 0; ctx.Err() == nil && i < 400; i++ {
				ev, err := h.Publish(context.Background(), topics[r.IntN(len(topics))], i)
				if err != nil {
					t.Error(err)
					return
				}
				ledgerMu.Lock()
				ledger[ev.Sequence] = ev.Topic
				ledgerMu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, 3))
		for ctx.Err() == nil {
			h.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 150})
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(r.IntN(20)) * time.Millisecond):
			}
		}
	}()
	type client struct {
		scope  string
		cursor int64
		got    []int64    // ids received, in order
		gaps   [][2]int64 // the gaps' [missedFrom, missedThrough]
	}
	var clients []*client
	for _, scope := range []string{"topic=a", "topic=b&topic=c", ""} {
		clients = append(clients, &client{scope: scope})
	}
	stopAt := time.Now().Add(2 * time.Second)
	for time.Now().Before(stopAt) {
		for _, c := range clients {
			p := wiretest.Poll(t, base, fmt.Sprintf("%s&cursor=%d&limit=%d&wait=0.05", c.scope, c.cursor, 1+rng.IntN(20)))
			if p.Gap != nil {
				if p.Gap.Reason != "pruned" {
					t.Fatalf("%s: gap %s", c.scope, p.Gap.String())
				}
				c.gaps = append(c.gaps, [2]int64{*p.Gap.MissedFrom, *p.Gap.MissedThrough})
			}
			for _, id := range p.IDs() {
				if id <= c.cursor {
					t.Fatalf("%s: id %d after cursor %d", c.scope, id, c.cursor)
				}
				c.got = append(c.got, id)
				c.cursor = id
			}
			if len(p.Events) == 0 && p.Cursor != c.cursor && p.Gap == nil {
				t.Fatalf("%s: empty answer moved the cursor %d -> %d", c.scope, c.cursor, p.Cursor)
			}
			c.cursor = p.Cursor
		}
	}
	cancel()
	wg.Wait()
	// Every event ever stored is known by its sequence from the publishers'
	// point of view through the log: read it without retention now.
	final, err := h.LatestSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Drain each client to the head, then compare with what was published:
	// the log's rows plus the pruned ones, reconstructed from what every
	// client saw and the gaps. A pruned row is in some gap's range.
	for _, c := range clients {
		for {
			p := wiretest.Poll(t, base, fmt.Sprintf("%s&cursor=%d&limit=1000", c.scope, c.cursor))
			if p.Gap != nil {
				c.gaps = append(c.gaps, [2]int64{*p.Gap.MissedFrom, *p.Gap.MissedThrough})
			}
			c.got = append(c.got, p.IDs()...)
			c.cursor = p.Cursor
			if !p.More {
				break
			}
		}
	}
	visible := func(scope string, topic string) bool {
		if topic == "" {
			return true
		}
		q, _ := url.ParseQuery(scope)
		return len(q["topic"]) == 0 || slices.Contains(q["topic"], topic)
	}
	for _, c := range clients {
		seen := map[int64]bool{}
		for _, id := range c.got {
			topic, ok := ledger[id]
			switch {
			case !ok:
				t.Fatalf("%s: id %d was never acknowledged", c.scope, id)
			case !visible(c.scope, topic):
				t.Fatalf("%s: id %d of topic %q is outside the scope", c.scope, id, topic)
			case seen[id]:
				t.Fatalf("%s: %d twice", c.scope, id)
			}
			seen[id] = true
		}
		// Every acknowledged event of the scope was received, or lies in
		// a gap's range: no silent hole.
		missing := 0
		for seq, topic := range ledger {
			if !visible(c.scope, topic) || seen[seq] {
				continue
			}
			if !slices.ContainsFunc(c.gaps, func(g [2]int64) bool { return g[0] <= seq && seq <= g[1] }) {
				t.Errorf("%s: event %d (topic %q) neither received nor named in a gap", c.scope, seq, topic)
			}
			missing++
		}
		t.Logf("%s: %d events received, %d named in %d gaps; final cursor %d, head %d",
			c.scope, len(c.got), missing, len(c.gaps), c.cursor, final)
	}
	if len(ledger) < 100 {
		t.Fatalf("only %d events published", len(ledger))
	}
}

// Polls near the head are answered from the window of the newest events
// (PollOptions.MemoryEvents), byte for byte as the log answers them: a hub
// with a small window and a hub that reads every poll from the log answer
// the same queries over one log, which a third hub (another process or
// node) also writes and prunes without the first being told, while events
// with repeated ids, broadcasts and payloads the encoder escapes go in.
func testPollMemoryMatchesLog(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	mem := open(replayd.Options{Poll: replayd.PollOptions{MemoryEvents: 40, MemoryBytes: 4 << 10}})
	fromLog := open(replayd.Options{Poll: replayd.PollOptions{MemoryEvents: -1}})
	other := open(replayd.Options{})
	mem.Subscribe(func(replayd.Event) {}) // deliveries then read the other hub's rows into the window
	memURL, logURL := wiretest.ServePoll(t, mem), wiretest.ServePoll(t, fromLog)
	rng := rand.New(rand.NewPCG(testSeed(t), 4))
	ctx := context.Background()
	topics := []string{"a", "b", "c", ""}
	scopes := [][]string{nil, {"a"}, {"b"}, {"a", "b"}, {"c", "a"}}
	payloads := []string{`1`, `{"s":"a<b"}`, `["&"]`, "\"\u2028\"", `[1, 2]`, `{"n":[1,2,3]}`, `"` + strings.Repeat("x", 600) + `"`}
	var known []int64
	polls := 0
	for step := range 600 {
		switch r := rng.IntN(100); {
		case r < 30:
			evs := make([]replayd.Event, rng.IntN(6)+1)
			for i := range evs {
				evs[i] = replayd.Event{Topic: topics[rng.IntN(len(topics))], Payload: json.RawMessage(payloads[rng.IntN(len(payloads))])}
				if rng.IntN(4) == 0 {
					evs[i].EventID = "id" + strconv.Itoa(rng.IntN(40)) // some repeat: duplicates
				}
			}
			for _, res := range mem.PublishBatch(ctx, evs) {
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				if !res.Duplicate {
					known = append(known, res.Event.Sequence)
				}
			}
		case r < 33:
			known = append(known, mustPublish(t, other, topics[rng.IntN(len(topics))], step).Sequence)
		case r < 35:
			if _, err := other.Prune(ctx, replayd.RetentionPolicy{MaxEvents: int64(rng.IntN(60) + 1)}); err != nil {
				t.Fatal(err)
			}
		default:
			head, err := mem.LatestSequence(ctx)
			if err != nil {
				t.Fatal(err)
			}
			q := url.Values{}
			for _, tp := range scopes[rng.IntN(len(scopes))] {
				q.Add("topic", tp)
			}
			switch c := rng.IntN(8); {
			case c < 4 && len(known) > 0: // a recent event
				q.Set("cursor", strconv.FormatInt(known[max(0, len(known)-1-rng.IntN(min(len(known), 60)))], 10))
			case c < 5:
				q.Set("cursor", strconv.FormatInt(head, 10))
			case c < 6 && len(known) > 0: // just above an event: a spent or skipped sequence
				q.Set("cursor", strconv.FormatInt(known[rng.IntN(len(known))]+1, 10))
			case c < 7:
				q.Set("cursor", strconv.FormatInt(head+int64(rng.IntN(3))+1, 10)) // above the head
			}
			if rng.IntN(4) > 0 {
				q.Set("limit", strconv.Itoa(rng.IntN(20)+1))
			}
			q.Set("wait", "0")
			polls++
			mstatus, _, mbody := wiretest.GetPoll(t, memURL, q.Encode())
			lstatus, _, lbody := wiretest.GetPoll(t, logURL, q.Encode())
			if mstatus != lstatus || string(mbody) != string(lbody) {
				t.Fatalf("step %d, poll %s:\nwith the window: %d %s\nfrom the log:    %d %s", step, q.Encode(), mstatus, mbody, lstatus, lbody)
			}
		}
	}
	hits, none := mem.Metrics().PollsFromMemory, fromLog.Metrics().PollsFromMemory
	t.Logf("%d polls, %d answered from the window", polls, hits)
	if none != 0 || hits < uint64(polls)/4 {
		t.Fatalf("%d of %d polls answered from the window (%d by the hub without one); want at least a quarter", hits, polls, none)
	}
}

// testSeed returns a random seed, logged, or the one REPLAYD_HUBTEST_SEED
// gives to rerun a failure.
func testSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("REPLAYD_HUBTEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("REPLAYD_HUBTEST_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with REPLAYD_HUBTEST_SEED=%d)", seed, seed)
	return seed
}

// A poll answer's memory is bounded whatever the payloads (issue 17, row
// 1): over 24 events of 1 MiB (the fourth needing escapes, six
// bytes on the wire for each of its characters), one poll asking for all
// of them holds at most 64 MiB of heap above the level before, and four
// at once at most 128 MiB; the answer is cut at 4 MiB of payload (at least
// one event, more true), and paging on from its cursor gets every event
// once, in order, as stored.
func testPollMemoryBounded(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	const events = 24
	plain := `"` + strings.Repeat("x", 1<<20-2) + `"`
	escaped := `"` + strings.Repeat("<", 1<<20-2) + `"`
	want := map[int64]string{} // the payload each event's data must be on the wire
	var seqs []int64           // the events' sequences, in order
	for i := range events {
		raw := plain
		if i == 3 { // in the first answer
			raw = escaped
		}
		ev := mustPublish(t, h, "big", json.RawMessage(raw))
		want[ev.Sequence] = raw
		seqs = append(seqs, ev.Sequence)
	}
	wire := func(raw string) string { return strings.ReplaceAll(raw, "<", `\u003c`) }
	query := fmt.Sprintf("topic=big&cursor=0&limit=%d", events)
	for _, c := range []struct {
		polls int
		limit uint64
	}{{1, 64 << 20}, {4, 128 << 20}} {
		var answers [4]wiretest.LargePoll
		var errs [4]error
		_, peak := wiretest.PeakHeap(func() {
			var wg sync.WaitGroup
			for i := range c.polls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answers[i], errs[i] = wiretest.GetLargePoll(base, query, 0) // counted, not kept
				}()
			}
			wg.Wait()
		})
		for i := range c.polls {
			if errs[i] != nil || answers[i].Status != http.StatusOK {
				t.Fatalf("poll %d of %d: status %d, %v", i, c.polls, answers[i].Status, errs[i])
			}
		}
		t.Logf("%d polls at once over %d events of 1 MiB: heap in use peaked %s above the level before; answers of %s",
			c.polls, events, wiretest.MiB(peak), wiretest.MiB(uint64(answers[0].Size)))
		if peak > c.limit {
			t.Errorf("%d polls at once: heap in use peaked %s above the level before, want at most %s",
				c.polls, wiretest.MiB(peak), wiretest.MiB(c.limit))
		}
	}
	// The cut: at least one event, none after the payloads reach 4 MiB,
	// more true; and paging on gets the rest, once each, in order.
	cursor, pages, next := int64(0), 0, 0 // next: the index in seqs of the event due
	for more := true; more; pages++ {
		p := wiretest.Poll(t, base, fmt.Sprintf("topic=big&cursor=%d&limit=%d", cursor, events))
		if len(p.Events) == 0 {
			t.Fatalf("page %d at cursor %d: no event, more %v", pages, cursor, p.More)
		}
		size := 0
		for i, ev := range p.Events {
			if size >= wiretest.PollPageBytes {
				t.Fatalf("page %d: event %d of %d comes after %d bytes of payload", pages, i+1, len(p.Events), size)
			}
			if next >= len(seqs) || ev.ID != seqs[next] || string(ev.Data) != wire(want[ev.ID]) {
				t.Fatalf("page %d: event %d (%d bytes), want the event at index %d of %v", pages, ev.ID, len(ev.Data), next, seqs)
			}
			size += len(want[ev.ID])
			next++
		}
		if p.Cursor != p.Events[len(p.Events)-1].ID || p.More != (p.Cursor < seqs[len(seqs)-1]) {
			t.Fatalf("page %d: cursor %d, more %v", pages, p.Cursor, p.More)
		}
		cursor, more = p.Cursor, p.More
	}
	if next != events || pages < events/5 {
		t.Fatalf("%d pages brought %d of %d events", pages, next, events)
	}
}
