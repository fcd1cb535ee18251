package storetest

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

func read(t *testing.T, s replayd.Store, req storage.ReadRequest) storage.Page {
	t.Helper()
	p, err := s.Read(ctxT(t), req)
	if err != nil {
		t.Fatalf("Read %+v: %v", req, err)
	}
	return p
}

// Read returns the oldest events of the scope in (After, Through], at most
// Limit, with More, the head and the scope's watermark.
func testRead(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	rng := rand.New(rand.NewPCG(1, 2))
	m := randomLog(t, rng, s, s2, 120, "r")
	checkReads(t, rng, s2, m, 200)
	// After a prune, the same holds of what is left, with watermarks.
	n, err := s.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 70})
	if err != nil || n != 50 {
		t.Fatalf("Prune MaxEvents 70 of 120: %d, %v", n, err)
	}
	m.prunePrefix(50)
	checkReads(t, rng, s2, m, 200)
	// Limit <= 0 means 100; Through 0 no bound.
	p := read(t, s, storage.ReadRequest{})
	if want := m.above(nil, 0, m.head); len(p.Events) != min(100, len(want)) {
		t.Fatalf("Read with zero limit: %d events, want %d", len(p.Events), min(100, len(want)))
	}
}

func checkReads(t *testing.T, rng *rand.Rand, s replayd.Store, m *model, n int) {
	t.Helper()
	for range n {
		scope := scopes[rng.IntN(len(scopes))]
		after := m.cursor(rng, 2)
		var through int64
		if rng.IntN(2) == 0 {
			through = after + rng.Int64N(m.head+3-after)
		}
		limit := []int{1, 2, 5, 17, 1000}[rng.IntN(5)]
		req := storage.ReadRequest{Scope: scope, After: after, Through: through, Limit: limit}
		checkRead(t, s, m, req)
	}
}

func checkRead(t *testing.T, s replayd.Store, m *model, req storage.ReadRequest) {
	t.Helper()
	through := req.Through
	if through == 0 {
		through = 1<<63 - 1
	}
	all := m.above(req.Scope, req.After, through)
	want, size := []replayd.Event{}, 0
	for _, e := range all {
		if len(want) == req.Limit || (req.MaxBytes > 0 && size >= req.MaxBytes) {
			break
		}
		want = append(want, e)
		size += len(e.Payload)
	}
	p := read(t, s, req)
	if len(p.Events) != len(want) {
		t.Fatalf("Read %+v: %v, want %v", req, seqs(p.Events), seqs(want))
	}
	for i := range want {
		if !sameEvent(p.Events[i], want[i]) {
			t.Fatalf("Read %+v: event %d is %+v, want %+v", req, i, p.Events[i], want[i])
		}
	}
	if more := len(all) > len(want); p.More != more {
		t.Fatalf("Read %+v: More %v, want %v (%d of %d)", req, p.More, more, len(want), len(all))
	}
	if p.Head != m.head {
		t.Fatalf("Read %+v: Head %d, want %d", req, p.Head, m.head)
	}
	if w := m.watermark(req.Scope); p.Watermark != w {
		t.Fatalf("Read %+v: Watermark %d, want %d (marks %v)", req, p.Watermark, w, m.marks)
	}
	if f := m.foreign(req.After); p.Foreign != f {
		t.Fatalf("Read %+v: Foreign %v, want %v (head %d)", req, p.Foreign, f, m.head)
	}
}

// MaxBytes stops a page once its events hold that many payload bytes, but
// a page holds at least one event, however large.
func testReadMaxBytes(t *testing.T, open func() replayd.Store) {
	s := open()
	m := startModel(t, s)
	m.add(appendAll(t, s, ev("big", "a", 5000), ev("s1", "a", 10), ev("s2", "", 10), ev("s3", "a", 10), ev("s4", "b", 10))...)
	big := m.evs[0].Sequence
	for _, req := range []storage.ReadRequest{
		{Limit: 10, MaxBytes: 100},             // the big one alone, More
		{Limit: 10, MaxBytes: 1},               // at least one
		{After: big, Limit: 10, MaxBytes: 15},  // two small ones
		{After: big, Limit: 10, MaxBytes: 30},  // three
		{After: big, Limit: 2, MaxBytes: 1000}, // the limit first
		{Scope: []string{"a"}, After: big, Limit: 10, MaxBytes: 20},
		{Scope: []string{"b"}, Limit: 10, MaxBytes: 1},
	} {
		checkRead(t, s, m, req)
	}
	p := read(t, s, storage.ReadRequest{Limit: 10, MaxBytes: 100})
	if len(p.Events) != 1 || !p.More {
		t.Fatalf("a page over MaxBytes: %v, More %v", seqs(p.Events), p.More)
	}
}

// Window, and Count of a storage.Counter, agree with a model for random logs, scopes, cursors and
// limits, before and after prunes.
func testWindowModel(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	rng := rand.New(rand.NewPCG(3, 4))
	m := randomLog(t, rng, s, s2, 150, "w")
	check := func() {
		t.Helper()
		for range 100 {
			scope := scopes[rng.IntN(len(scopes))]
			cursor := m.cursor(rng, 3)
			limit := []int{0, 1, 3, 10, 40, 1000}[rng.IntN(6)]
			checkWindow(t, s2, m, scope, cursor, limit)
			after := m.cursor(rng, 2)
			before := after + rng.Int64N(m.head+4-after)
			c, ok := s.(storage.Counter) // optional: tested if the store has it
			if !ok {
				continue
			}
			n, err := c.Count(ctxT(t), scope, after, before)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(len(m.above(scope, after, before-1))); n != want {
				t.Fatalf("Count %v (%d, %d) = %d, want %d", scope, after, before, n, want)
			}
		}
	}
	check()
	for _, keep := range []int64{120, 61, 5} {
		n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: keep})
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(len(m.evs)) - keep; n != want {
			t.Fatalf("Prune MaxEvents %d: deleted %d, want %d", keep, n, want)
		}
		m.prunePrefix(int(n))
		check()
		// More appends above the pruned prefix.
		more := randomLog(t, rng, s, s2, 20, fmt.Sprintf("w%d-", keep))
		m.add(more.evs...)
		check()
	}
}

func checkWindow(t *testing.T, s replayd.Store, m *model, scope []string, cursor int64, limit int) {
	t.Helper()
	w, err := s.Window(ctxT(t), scope, cursor, limit)
	if err != nil {
		t.Fatalf("Window %v %d %d: %v", scope, cursor, limit, err)
	}
	if w.Head != m.head {
		t.Fatalf("Window %v %d %d: Head %d, want %d", scope, cursor, limit, w.Head, m.head)
	}
	if f := m.foreign(cursor); w.Foreign != f {
		t.Fatalf("Window %v %d %d: Foreign %v, want %v (head %d)", scope, cursor, limit, w.Foreign, f, m.head)
	}
	if cursor >= m.head {
		return
	}
	v := m.above(scope, cursor, m.head)
	nw := min(len(v), max(limit, 0))
	window, skipped := v[len(v)-nw:], v[:len(v)-nw]
	desc := func() string {
		return fmt.Sprintf("Window %v cursor %d limit %d = %+v; model window %v skipped %v marks %v",
			scope, cursor, limit, w, seqs(window), seqs(skipped), m.marks)
	}
	var ws storage.Span
	if len(skipped) > 0 {
		ws = storage.Span{Count: int64(len(skipped)), First: skipped[0].Sequence, Last: skipped[len(skipped)-1].Sequence}
	}
	mark := m.watermark(scope)
	got := w.Skipped
	if mark > cursor {
		// Count is promised only when nothing above the cursor was
		// pruned (a pruned gap counts nothing).
		got.Count = ws.Count
	}
	if got != ws {
		t.Fatalf("%s: Skipped want %+v", desc(), ws)
	}
	if w.Watermark != mark {
		t.Fatalf("%s: Watermark want %d", desc(), mark)
	}
	// [From, Head] holds exactly the window; From-1 is at or above the
	// cursor and every skipped event (it may be below the watermark, where
	// topics pruned less keep events).
	upper := m.head + 1
	if len(window) > 0 {
		upper = window[0].Sequence
	}
	if w.From > upper || w.From-1 < cursor || w.From-1 < ws.Last {
		t.Fatalf("%s: From out of place (want From <= %d and From-1 >= cursor, last skipped)", desc(), upper)
	}
}
