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
