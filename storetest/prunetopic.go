package storetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// Per-topic retention (storage.RetentionPolicy.Topics): each topic loses
// a prefix of its own events, by the first entry that matches it or by the
// default, whose MaxEvents counts the broadcasts and the topics no entry
// matches together.

// newestOf returns, for the model's events that keep says are counted
// together, the sequences of all but the newest n: the count's condemned.
func newestOf(m *model, n int64, counted func(replayd.Event) bool) map[int64]bool {
	var all []int64
	for _, e := range m.evs {
		if counted(e) {
			all = append(all, e.Sequence)
		}
	}
	out := map[int64]bool{}
	for i := 0; i < len(all)-int(n); i++ {
		out[all[i]] = true
	}
	return out
}

// checkAll checks reads, windows and counts of every scope against m.
func checkAll(t *testing.T, rng *rand.Rand, s replayd.Store, m *model) {
	t.Helper()
	for _, scope := range scopes {
		checkRead(t, s, m, storage.ReadRequest{Scope: scope, Limit: 100000})
	}
	checkReads(t, rng, s, m, 60)
	for range 80 {
		scope := scopes[rng.IntN(len(scopes))]
		cursor := m.cursor(rng, 3)
		limit := []int{0, 1, 3, 10, 40, 1000}[rng.IntN(6)]
		checkWindow(t, s, m, scope, cursor, limit)
		if c, ok := s.(storage.Counter); ok {
			after := m.cursor(rng, 2)
			before := after + rng.Int64N(m.head+4-after)
			n, err := c.Count(ctxT(t), scope, after, before)
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(len(m.above(scope, after, before-1))); n != want {
				t.Fatalf("Count %v (%d, %d) = %d, want %d (marks %v)", scope, after, before, n, want, m.marks)
			}
		}
	}
}

// Count limits per topic: "a" keeps its newest 7, "b" matches a pattern
// that keeps everything, and the default keeps the newest 30 of "c" and
// the broadcasts together; a second store reads the same, and a prune
// again deletes nothing.
func testPruneTopicsByCount(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	rng := rand.New(rand.NewPCG(7, 8))
	m := randomLog(t, rng, s, s2, 2600, "t") // more than one batch of every topic
	policy := replayd.RetentionPolicy{MaxEvents: 30, Topics: []storage.TopicPolicy{
		{Topic: "a", MaxEvents: 7},
		{Topic: "b*"},                 // kept for ever, whatever the default
		{Topic: "a", MaxEvents: 1000}, // never reached: first match wins
	}}
	byA := newestOf(m, 7, func(e replayd.Event) bool { return e.Topic == "a" })
	byRest := newestOf(m, 30, func(e replayd.Event) bool { return e.Topic == "c" || e.Topic == "" })
	want := m.pruneWhere(func(e replayd.Event) bool { return byA[e.Sequence] || byRest[e.Sequence] })
	n, err := s.Prune(ctxT(t), policy)
	if err != nil || n != want {
		t.Fatalf("Prune %+v: %d, %v; want %d", policy, n, err, want)
	}
	checkAll(t, rng, s2, m)
	if n, err := s2.Prune(ctxT(t), policy); err != nil || n != 0 {
		t.Fatalf("Prune again: %d, %v", n, err)
	}
	// More events, then the whole-log policy over the holes: a prefix of
	// the log.
	more := randomLog(t, rng, s, s2, 200, "t2-")
	m.add(more.evs...)
	checkAll(t, rng, s, m)
	keep := int64(len(m.evs)) - 100
	n, err = s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: keep})
	if err != nil || n != 100 {
		t.Fatalf("whole-log Prune after per-topic ones: %d, %v; want 100", n, err)
	}
	m.prunePrefix(100)
	checkAll(t, rng, s, m)
}

// Age limits per topic: "a" loses its events older than MaxAge, nothing
// else does (the default has no limit).
func testPruneTopicsByAge(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	rng := rand.New(rand.NewPCG(9, 10))
	m := randomLog(t, rng, s, s2, 300, "old")
	waitClock(t, m.evs[len(m.evs)-1].CreatedAt, 300*time.Millisecond)
	young := randomLog(t, rng, s, s2, 40, "young")
	m.add(young.evs...)
	maxAge := time.Since(young.evs[0].CreatedAt) + 150*time.Millisecond
	oldest := young.evs[0].Sequence
	want := m.pruneWhere(func(e replayd.Event) bool { return e.Topic == "a" && e.Sequence < oldest })
	policy := replayd.RetentionPolicy{Topics: []storage.TopicPolicy{{Topic: "a", MaxAge: maxAge}}}
	n, err := s2.Prune(ctxT(t), policy)
	if err != nil || n != want {
		t.Fatalf("Prune %+v: %d, %v; want %d", policy, n, err, want)
	}
	checkAll(t, rng, s, m)
}

// A scope over topics pruned differently: "a" pruned far above a cursor,
// "b" never. The scope's watermark names where it lost events, and Read
// and Window still give every retained event of "b" inside that range.
func testPruneTopicsMixedScope(t *testing.T, open func() replayd.Store) {
	s := open()
	m := startModel(t, s)
	for i := range 40 {
		m.add(appendAll(t, s, ev(fmt.Sprintf("a%d", i), "a", 5), ev(fmt.Sprintf("b%d", i), "b", 5))...)
	}
	cursor := m.evs[9].Sequence // the 5th pair
	n, err := s.Prune(ctxT(t), replayd.RetentionPolicy{Topics: []storage.TopicPolicy{{Topic: "a", MaxEvents: 5}}})
	if err != nil || n != 35 {
		t.Fatalf("Prune a to its newest 5: %d, %v", n, err)
	}
	m.pruneWhere(func(e replayd.Event) bool { return e.Topic == "a" && e.Sequence < m.evs[70].Sequence })
	scope := []string{"a", "b"}
	w, err := s.Window(ctxT(t), scope, cursor, 1000)
	if err != nil {
		t.Fatal(err)
	}
	markA := m.marks["a"]
	want := m.above(scope, cursor, m.head)
	if w.Watermark != markA || w.From <= cursor || w.From > want[0].Sequence || w.Skipped != (storage.Span{}) {
		t.Fatalf("Window %v from %d: %+v; want watermark %d, From in (%d, %d], nothing skipped", scope, cursor, w, markA, cursor, want[0].Sequence)
	}
	p := read(t, s, storage.ReadRequest{Scope: scope, After: cursor, Limit: 1000})
	if len(p.Events) != len(want) || p.Watermark != markA || len(want) != 35+5 {
		t.Fatalf("Read %v after %d: %v (watermark %d); want %v (watermark %d)", scope, cursor, seqs(p.Events), p.Watermark, seqs(want), markA)
	}
	// A limit of 10: the window is the newest 10 (a's 5 and b's newest 5),
	// the rest of b's skipped.
	w, err = s.Window(ctxT(t), scope, cursor, 10)
	if err != nil {
		t.Fatal(err)
	}
	if w.From != want[len(want)-10].Sequence || w.Skipped.First != want[0].Sequence || w.Skipped.Last != want[len(want)-11].Sequence {
		t.Fatalf("Window %v from %d limit 10: %+v; want From %d, skipped %d..%d", scope, cursor, w, want[len(want)-10].Sequence, want[0].Sequence, want[len(want)-11].Sequence)
	}
	checkAll(t, rand.New(rand.NewPCG(11, 12)), s, m)
}

// A policy with a bad pattern, or a negative limit of an entry, deletes
// nothing and says why.
func testPruneTopicsInvalid(t *testing.T, open func() replayd.Store) {
	s := open()
	appendAll(t, s, ev("x", "a", 5))
	for _, tp := range []storage.TopicPolicy{{Topic: ""}, {Topic: "a*b"}, {Topic: "*a"}, {Topic: "a", MaxEvents: -1}, {Topic: "a", MaxAge: -time.Second}} {
		n, err := s.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 1, Topics: []storage.TopicPolicy{tp}})
		if n != 0 || !errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("Prune with topic policy %+v: %d, %v; want 0 and ErrInvalid", tp, n, err)
		}
	}
}

// PruneTopic (storage.TopicPruner, optional) deletes a topic's events up
// to a sequence, or all of them, and nothing of other topics.
func testPruneTopic(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	tp, ok := s.(storage.TopicPruner)
	if !ok {
		t.Skip("the store is no storage.TopicPruner")
	}
	rng := rand.New(rand.NewPCG(13, 14))
	m := randomLog(t, rng, s, s2, 1500, "p")
	var as []int64
	for _, e := range m.evs {
		if e.Topic == "a" {
			as = append(as, e.Sequence)
		}
	}
	through := as[len(as)/2]
	want := m.pruneWhere(func(e replayd.Event) bool { return e.Topic == "a" && e.Sequence <= through })
	n, err := tp.PruneTopic(ctxT(t), "a", through)
	if err != nil || n != want {
		t.Fatalf("PruneTopic a through %d: %d, %v; want %d", through, n, err, want)
	}
	checkAll(t, rng, s2, m)
	want = m.pruneWhere(func(e replayd.Event) bool { return e.Topic == "c" })
	if n, err := tp.PruneTopic(ctxT(t), "c", math.MaxInt64); err != nil || n != want {
		t.Fatalf("PruneTopic c entirely: %d, %v; want %d", n, err, want)
	}
	if n, err := tp.PruneTopic(ctxT(t), "nobody", math.MaxInt64); err != nil || n != 0 {
		t.Fatalf("PruneTopic of a topic without events: %d, %v", n, err)
	}
	if _, err := tp.PruneTopic(ctxT(t), "", math.MaxInt64); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("PruneTopic of the broadcasts: %v; want ErrInvalid", err)
	}
	checkAll(t, rng, s, m)
}
