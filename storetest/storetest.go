// Package storetest checks that a [replayd.Store] keeps the storage
// contract: every promise of the Store doc, as deterministic subtests, on
// the model of golang.org/x/net/nettest.TestConn. A backend's test runs
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) func() replayd.Store {
//			db := newEmptyDatabase(t)        // a fresh, empty log
//			return func() replayd.Store {    // each call: another store on it
//				s := open(t, db)
//				t.Cleanup(func() { s.Close() })
//				return s
//			}
//		})
//	}
//
// newLog is called once per subtest and must return a function that opens
// a store on a new, empty log; each further call opens another store on
// the same log (as another process or node would), so the subtests can
// check what holds between stores. Each call is an open of the log, which
// raises its sequence floor (see replayd.Store, "Log identity"):
// SequenceFloor checks that. Closing the stores (and the log) is the
// factory's business, with t.Cleanup.
//
// The package chaostest is the other kit: given a factory of hubs on one
// log, it runs the chaos run and its oracle (contiguity or an explicit gap) over the store.
//
// Some subtests wait for the clock to move on (created_at and MaxAge have
// millisecond precision): tens to hundreds of milliseconds each, bounded.
package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// Run runs every subtest of the contract against the stores newLog makes.
func Run(t *testing.T, newLog func(t *testing.T) (open func() replayd.Store)) {
	for _, st := range []struct {
		name string
		fn   func(t *testing.T, open func() replayd.Store)
	}{
		{"AppendSequences", testAppendSequences},
		{"CreatedAtNeverDecreases", testCreatedAt},
		{"Duplicates", testDuplicates},
		{"HeadAfterPruningEverything", testHeadAfterPruneAll},
		{"ReadScopesAndLimits", testRead},
		{"ReadMaxBytes", testReadMaxBytes},
		{"WindowAndCountMatchModel", testWindowModel},
		{"PruneByCount", testPruneByCount},
		{"PruneByAge", testPruneByAge},
		{"TwoStoresNoSkippedRows", testTwoStores},
		{"SequenceFloor", testSequenceFloor},
	} {
		t.Run(st.name, func(t *testing.T) {
			open := newLog(t)
			st.fn(t, open)
		})
	}
}

// ctxT returns a context bounded for one subtest's calls.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var topics = []string{"a", "b", "c", ""} // "" = broadcast

// ev returns an event to append: a fresh id, a JSON payload of size bytes
// (at least 3).
func ev(id, topic string, size int) replayd.Event {
	size = max(size, 3)
	p, _ := json.Marshal(strings.Repeat("x", size-2))
	return replayd.Event{EventID: id, Type: "message", Topic: topic, Payload: p}
}

// appendAll appends evs and fails the test on an error or a result with
// Err or Duplicate set; it returns the stored events.
func appendAll(t *testing.T, s replayd.Store, evs ...replayd.Event) []replayd.Event {
	t.Helper()
	res, err := s.Append(ctxT(t), evs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	if len(res) != len(evs) {
		t.Fatalf("Append: %d results for %d events", len(res), len(evs))
	}
	out := make([]replayd.Event, len(res))
	for i, r := range res {
		if r.Err != nil || r.Duplicate {
			t.Fatalf("Append: event %d (%s): %+v", i, evs[i].EventID, r)
		}
		out[i] = r.Event
	}
	return out
}

func head(t *testing.T, s replayd.Store) int64 {
	t.Helper()
	h, err := s.Head(ctxT(t))
	if err != nil {
		t.Fatalf("Head: %v", err)
	}
	return h
}

// model is what the log must hold: the retained events, ascending, and
// each topic's prune watermark ("" for broadcasts). floor is the head when
// the model started, after the stores were opened: the model knows
// nothing of the sequence floor's skipped ranges below it (see
// testSequenceFloor), so its cursors are 0 or at least floor.
type model struct {
	evs   []replayd.Event
	marks map[string]int64
	head  int64
	floor int64
}

// startModel returns the model of the log s opened: no events yet
// (they are added with add), the head as s reads it.
func startModel(t *testing.T, s replayd.Store) *model {
	m := newModel()
	m.head = head(t, s)
	m.floor = m.head
	return m
}

// cursor returns a random cursor of the model: 0, or from the floor to
// extra above the head (above it is foreign).
func (m *model) cursor(rng *rand.Rand, extra int64) int64 {
	if rng.IntN(8) == 0 {
		return 0
	}
	return m.floor + rng.Int64N(m.head-m.floor+extra)
}

// foreign reports whether the cursor c (0 or at least floor) is foreign:
// above the head.
func (m *model) foreign(c int64) bool { return c > m.head }

func newModel() *model { return &model{marks: map[string]int64{}} }

func (m *model) add(evs ...replayd.Event) {
	for _, e := range evs {
		m.evs = append(m.evs, e)
		m.head = max(m.head, e.Sequence)
	}
}

// prunePrefix drops the first n events, raising watermarks.
func (m *model) prunePrefix(n int) {
	for _, e := range m.evs[:n] {
		m.marks[e.Topic] = max(m.marks[e.Topic], e.Sequence)
	}
	m.evs = slices.Clone(m.evs[n:])
}

func visible(e replayd.Event, scope []string) bool {
	return len(scope) == 0 || e.Topic == "" || slices.Contains(scope, e.Topic)
}

// above returns the scope's retained events in (after, through].
func (m *model) above(scope []string, after, through int64) []replayd.Event {
	var out []replayd.Event
	for _, e := range m.evs {
		if e.Sequence > after && e.Sequence <= through && visible(e, scope) {
			out = append(out, e)
		}
	}
	return out
}

func (m *model) watermark(scope []string) int64 {
	var w int64
	for topic, s := range m.marks {
		if len(scope) == 0 || topic == "" || slices.Contains(scope, topic) {
			w = max(w, s)
		}
	}
	return w
}

// sameEvent reports whether got is want as stored (CreatedAt compared to
// the millisecond).
func sameEvent(got, want replayd.Event) bool {
	return got.Sequence == want.Sequence && got.EventID == want.EventID && got.Type == want.Type &&
		got.Topic == want.Topic && string(got.Payload) == string(want.Payload) &&
		got.CreatedAt.UnixMilli() == want.CreatedAt.UnixMilli()
}

func seqs(evs []replayd.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Sequence
	}
	return out
}

// Sequences are positive, increase across and within batches, are above
// the head before the append, and the head is the last one assigned, the
// same through every store on the log.
func testAppendSequences(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	// The sequence floor: a log once opened has a head, however new.
	last := head(t, s)
	if last <= 0 {
		t.Fatalf("Head of a new log once opened: %d, want the sequence floor", last)
	}
	for b := range 20 {
		before := head(t, s)
		var batch []replayd.Event
		for i := range b%5 + 1 {
			batch = append(batch, ev(fmt.Sprintf("e%d-%d", b, i), topics[(b+i)%len(topics)], 10))
		}
		st := s
		if b%2 == 1 {
			st = s2
		}
		got := appendAll(t, st, batch...)
		for i, e := range got {
			if e.Sequence <= last || e.Sequence <= before {
				t.Fatalf("batch %d: sequence %d after %d (head before %d)", b, e.Sequence, last, before)
			}
			last = e.Sequence
			in := batch[i]
			if e.EventID != in.EventID || e.Type != in.Type || e.Topic != in.Topic || string(e.Payload) != string(in.Payload) {
				t.Fatalf("stored %+v for %+v", e, in)
			}
			if e.CreatedAt.IsZero() {
				t.Fatalf("no CreatedAt: %+v", e)
			}
		}
		if h, h2 := head(t, s), head(t, s2); h != last || h2 != last {
			t.Fatalf("head %d / %d after appending through %d", h, h2, last)
		}
	}
	if res, err := s.Append(ctxT(t), nil); err != nil || len(res) != 0 {
		t.Fatalf("Append of nothing: %v, %v", res, err)
	}
}

// created_at never decreases as the sequence grows, across stores, and has
// millisecond precision at least.
func testCreatedAt(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	var all []replayd.Event
	for i := range 30 {
		st := s
		if i%3 == 0 {
			st = s2
		}
		all = append(all, appendAll(t, st, ev(fmt.Sprintf("c%d", i), "", 5))...)
		if i%10 == 0 { // let the clock move on
			waitClock(t, all[len(all)-1].CreatedAt, 3*time.Millisecond)
		}
	}
	distinct := 0
	for i := 1; i < len(all); i++ {
		if all[i].CreatedAt.Before(all[i-1].CreatedAt) {
			t.Fatalf("created_at went back: %v (seq %d) after %v (seq %d)",
				all[i].CreatedAt, all[i].Sequence, all[i-1].CreatedAt, all[i-1].Sequence)
		}
		if all[i].CreatedAt.After(all[i-1].CreatedAt) {
			distinct++
		}
	}
	if distinct == 0 {
		t.Fatal("every created_at equal across appends 3 ms apart: less than millisecond precision")
	}
	p := read(t, s, storage.ReadRequest{Limit: 100})
	for i, e := range p.Events {
		if !sameEvent(e, all[i]) {
			t.Fatalf("read %+v, appended %+v", e, all[i])
		}
	}
}

// waitClock waits until the wall clock is d past at (bounded).
func waitClock(t *testing.T, at time.Time, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Since(at) < d {
		if time.Now().After(deadline) {
			t.Fatalf("the clock did not pass %v", at.Add(d))
		}
		time.Sleep(time.Millisecond)
	}
}

// An event id stored earlier, or earlier in the same batch, is not stored
// again: its result is the original, with Duplicate; nothing is delivered
// to readers for it.
func testDuplicates(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	orig := appendAll(t, s, ev("dup", "a", 10), ev("other", "", 4))
	again := ev("dup", "b", 20) // another topic and payload: the original wins
	res, err := s2.Append(ctxT(t), []replayd.Event{ev("new1", "a", 5), again, ev("new2", "", 5), ev("new2", "c", 6)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results", len(res))
	}
	if res[0].Duplicate || res[2].Duplicate || res[0].Err != nil || res[2].Err != nil {
		t.Fatalf("fresh events: %+v, %+v", res[0], res[2])
	}
	if !res[1].Duplicate || !sameEvent(res[1].Event, orig[0]) {
		t.Fatalf("earlier duplicate: %+v, want the original %+v", res[1], orig[0])
	}
	if !res[3].Duplicate || !sameEvent(res[3].Event, res[2].Event) {
		t.Fatalf("duplicate within the batch: %+v, want %+v", res[3], res[2].Event)
	}
	if res[2].Event.Sequence <= res[0].Event.Sequence {
		t.Fatalf("order within the batch: %d then %d", res[0].Event.Sequence, res[2].Event.Sequence)
	}
	// A batch of only duplicates stores nothing.
	want := []int64{orig[0].Sequence, orig[1].Sequence, res[0].Event.Sequence, res[2].Event.Sequence}
	h := head(t, s)
	res, err = s.Append(ctxT(t), []replayd.Event{ev("dup", "", 3), ev("new1", "", 3)})
	if err != nil || len(res) != 2 || !res[0].Duplicate || !res[1].Duplicate {
		t.Fatalf("all duplicates: %+v, %v", res, err)
	}
	p := read(t, s, storage.ReadRequest{Limit: 100})
	if got := seqs(p.Events); !slices.Equal(got, want) {
		t.Fatalf("log holds %v, want %v", got, want)
	}
	if p.Head < h {
		t.Fatalf("head %d fell below %d", p.Head, h)
	}
}

func read(t *testing.T, s replayd.Store, req storage.ReadRequest) storage.Page {
	t.Helper()
	p, err := s.Read(ctxT(t), req)
	if err != nil {
		t.Fatalf("Read %+v: %v", req, err)
	}
	return p
}

// Pruning every event leaves the head where it was, and the next append
// goes above it.
func testHeadAfterPruneAll(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	var last replayd.Event
	for i := range 5 {
		last = appendAll(t, s, ev(fmt.Sprintf("p%d", i), topics[i%len(topics)], 8))[0]
	}
	waitClock(t, last.CreatedAt, 20*time.Millisecond)
	n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxAge: 5 * time.Millisecond})
	if err != nil || n != 5 {
		t.Fatalf("Prune everything: %d, %v", n, err)
	}
	if h := head(t, s); h != last.Sequence {
		t.Fatalf("head %d after pruning everything, was %d", h, last.Sequence)
	}
	p := read(t, s2, storage.ReadRequest{Limit: 10})
	if len(p.Events) != 0 || p.Head != last.Sequence || p.Watermark != last.Sequence {
		t.Fatalf("after pruning everything: %+v", p)
	}
	next := appendAll(t, s2, ev("next", "", 3))[0]
	if next.Sequence <= last.Sequence {
		t.Fatalf("sequence %d after a pruned head %d", next.Sequence, last.Sequence)
	}
}

// randomLog appends n events over both stores in random batches and returns
// the model.
func randomLog(t *testing.T, rng *rand.Rand, s, s2 replayd.Store, n int, prefix string) *model {
	m := startModel(t, s)
	for i := 0; i < n; {
		k := min(1+rng.IntN(6), n-i)
		batch := make([]replayd.Event, k)
		for j := range batch {
			batch[j] = ev(fmt.Sprintf("%s%d", prefix, i+j), topics[rng.IntN(len(topics))], 3+rng.IntN(40))
		}
		st := s
		if rng.IntN(2) == 1 {
			st = s2
		}
		if ta, ok := st.(storage.TxAppender); ok && rng.IntN(3) == 0 {
			m.add(appendInTx(t, ta, batch, rng.IntN(2) == 0)...)
		} else {
			m.add(appendAll(t, st, batch...)...)
		}
		i += k
	}
	return m
}

// appendInTx appends batch through a store's TxAppender capability, in
// one transaction, after one that appends the same batch and rolls back
// (if rollbackFirst): the rolled-back rows must leave no trace, and the
// committed ones must be numbered as Append numbers them (every model
// check on the log holds them to it).
func appendInTx(t *testing.T, ta storage.TxAppender, batch []replayd.Event, rollbackFirst bool) []replayd.Event {
	t.Helper()
	ctx := ctxT(t)
	if rollbackFirst {
		tx, err := ta.BeginTx(ctx)
		if err != nil {
			t.Fatalf("BeginTx: %v", err)
		}
		if _, err := ta.AppendTx(ctx, tx, batch); err != nil {
			t.Fatalf("AppendTx: %v", err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := ta.BeginTx(ctx)
	if err != nil {
		t.Fatalf("BeginTx: %v", err)
	}
	res, err := ta.AppendTx(ctx, tx, batch)
	if err != nil {
		tx.Rollback()
		t.Fatalf("AppendTx: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	out := make([]replayd.Event, len(res))
	for i, r := range res {
		if r.Err != nil || r.Duplicate {
			t.Fatalf("AppendTx: event %d (%s): %+v", i, batch[i].EventID, r)
		}
		out[i] = r.Event
	}
	return out
}

var scopes = [][]string{nil, {"a"}, {"b"}, {"a", "c"}, {"c", "b", "a"}, {"nobody"}}

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
	if w.Skipped != ws {
		t.Fatalf("%s: Skipped want %+v", desc(), ws)
	}
	if mark := m.watermark(scope); w.Watermark != mark {
		t.Fatalf("%s: Watermark want %d", desc(), mark)
	}
	// [From, Head] holds exactly the window; From-1 is at or above the
	// cursor, the watermark and every skipped event.
	upper := m.head + 1
	if len(window) > 0 {
		upper = window[0].Sequence
	}
	if w.From > upper || w.From-1 < cursor || w.From-1 < w.Watermark || w.From-1 < ws.Last {
		t.Fatalf("%s: From out of place (want From <= %d and From-1 >= cursor, watermark, last skipped)", desc(), upper)
	}
}

// MaxEvents keeps the newest MaxEvents of the whole log and deletes a
// prefix, raising each topic's watermark to the highest sequence deleted of
// it; a second store sees the same.
func testPruneByCount(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	rng := rand.New(rand.NewPCG(5, 6))
	m := randomLog(t, rng, s, s2, 2600, "c") // more than one prune batch
	n, err := s.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 100})
	if err != nil || n != 2500 {
		t.Fatalf("Prune: %d, %v; want 2500", n, err)
	}
	m.prunePrefix(2500)
	for _, scope := range scopes {
		checkRead(t, s2, m, storage.ReadRequest{Scope: scope, Limit: 1000})
	}
	if n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 100}); err != nil || n != 0 {
		t.Fatalf("Prune again: %d, %v", n, err)
	}
	if n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{}); err != nil || n != 0 {
		t.Fatalf("Prune with no limit: %d, %v", n, err)
	}
	// Watermarks never go down.
	n, err = s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 99})
	if err != nil || n != 1 {
		t.Fatalf("Prune one more: %d, %v", n, err)
	}
	m.prunePrefix(1)
	for _, scope := range scopes {
		checkRead(t, s, m, storage.ReadRequest{Scope: scope, Limit: 1000})
	}
}

// MaxAge deletes the events created before now-MaxAge: a prefix, since
// created_at never decreases.
func testPruneByAge(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	m := newModel()
	var old []replayd.Event
	for i := range 8 {
		old = append(old, appendAll(t, s, ev(fmt.Sprintf("old%d", i), topics[i%len(topics)], 5))...)
	}
	m.add(old...)
	waitClock(t, old[len(old)-1].CreatedAt, 300*time.Millisecond)
	young := appendAll(t, s2, ev("young1", "a", 5), ev("young2", "", 5))
	m.add(young...)
	// Old events are >= 300ms old, young ones about 0: cut at about 150ms.
	maxAge := time.Since(young[0].CreatedAt) + 150*time.Millisecond
	n, err := s.Prune(ctxT(t), replayd.RetentionPolicy{MaxAge: maxAge})
	if err != nil || n != int64(len(old)) {
		t.Fatalf("Prune MaxAge %v: %d, %v; want %d", maxAge, n, err, len(old))
	}
	m.prunePrefix(len(old))
	for _, scope := range scopes {
		checkRead(t, s2, m, storage.ReadRequest{Scope: scope, Limit: 100})
	}
	// Both limits: whichever deletes more.
	n, err = s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 1, MaxAge: time.Hour})
	if err != nil || n != 1 {
		t.Fatalf("Prune MaxEvents 1, MaxAge 1h: %d, %v", n, err)
	}
	m.prunePrefix(1)
	checkRead(t, s, m, storage.ReadRequest{Limit: 100})
}

// Two stores on one log, four appenders on each and a reader on a third
// store: the reader, reading above its cursor, never skips a row (sequence
// order is visibility order), and every store agrees on the head.
func testTwoStores(t *testing.T, open func() replayd.Store) {
	stores := []replayd.Store{open(), open()}
	reader := open()
	const perWriter, writers = 150, 4
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		appended []int64
		failed   = make(chan error, 2*writers)
	)
	done := make(chan struct{})
	for si, s := range stores {
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(si), uint64(w)))
				for i := 0; i < perWriter; {
					k := min(1+rng.IntN(4), perWriter-i)
					batch := make([]replayd.Event, k)
					for j := range batch {
						batch[j] = ev(fmt.Sprintf("s%dw%di%d", si, w, i+j), topics[rng.IntN(len(topics))], 8)
					}
					res, err := s.Append(context.Background(), batch)
					if err == nil && len(res) != k {
						err = fmt.Errorf("%d results for %d events", len(res), k)
					}
					if err != nil {
						failed <- err
						return
					}
					mu.Lock()
					for _, r := range res {
						appended = append(appended, r.Event.Sequence)
					}
					mu.Unlock()
					i += k
				}
			}()
		}
	}
	go func() { wg.Wait(); close(done) }()
	var (
		seen   []int64
		cursor int64
	)
	finished := false
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := reader.Read(ctxT(t), storage.ReadRequest{After: cursor, Limit: 64})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Events {
			if e.Sequence <= cursor {
				t.Fatalf("Read above %d returned %d", cursor, e.Sequence)
			}
			cursor = e.Sequence
			seen = append(seen, e.Sequence)
		}
		if p.Head < cursor {
			t.Fatalf("Head %d below an event read, %d", p.Head, cursor)
		}
		if finished && !p.More {
			break
		}
		select {
		case <-done:
			finished = true // one more pass reads the rest
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("appenders did not finish")
		}
	}
	select {
	case err := <-failed:
		t.Fatalf("Append: %v", err)
	default:
	}
	slices.Sort(appended)
	if len(appended) != 2*writers*perWriter {
		t.Fatalf("%d events appended", len(appended))
	}
	if !slices.Equal(seen, appended) {
		missing := 0
		for _, s := range appended {
			if _, ok := slices.BinarySearch(seen, s); !ok {
				missing++
			}
		}
		t.Fatalf("the reader skipped %d of %d rows: a row became visible below a sequence already read", missing, len(appended))
	}
	last := appended[len(appended)-1]
	for i, s := range append(stores, reader) {
		if h := head(t, s); h != last {
			t.Fatalf("store %d: head %d, want %d", i, h, last)
		}
	}
}

// The sequence floor (see replayd.Store): whoever opens a log raises its
// head to the clock in Unix microseconds and records the range skipped. A
// cursor strictly inside a skipped range, or above the head, is foreign,
// in Window and Read, through every store; 0, the head after each open and
// every sequence issued are not. Appends go on above the head.
func testSequenceFloor(t *testing.T, open func() replayd.Store) {
	before := time.Now().Add(-10 * time.Minute).UnixMicro() // a backend's clock may differ a little from ours
	s := open()
	h1 := head(t, s)
	if h1 < before {
		t.Fatalf("head of a log once opened: %d, want the clock in microseconds (about %d)", h1, time.Now().UnixMicro())
	}
	evs := appendAll(t, s, ev("f1", "a", 5), ev("f2", "", 5), ev("f3", "b", 5))
	h2 := head(t, s)
	if evs[0].Sequence <= h1 || h2 != evs[2].Sequence {
		t.Fatalf("appended %v after the head %d; head now %d", seqs(evs), h1, h2)
	}
	// Opening the log again raises the head again, past the last append.
	s2 := open()
	h3 := head(t, s2)
	if h3 <= h2+1 || head(t, s) != h3 {
		t.Fatalf("head after another open: %d (and %d through the first store), want above %d", h3, head(t, s), h2+1)
	}
	check := func(cursor int64, foreign bool) {
		t.Helper()
		for i, st := range []replayd.Store{s, s2} {
			for _, scope := range [][]string{nil, {"a"}} {
				w, err := st.Window(ctxT(t), scope, cursor, 10)
				if err != nil {
					t.Fatal(err)
				}
				p := read(t, st, storage.ReadRequest{Scope: scope, After: cursor})
				if w.Foreign != foreign || p.Foreign != foreign {
					t.Fatalf("store %d, scope %v, cursor %d (floors %d, %d; events %v): Window Foreign %v, Read Foreign %v; want %v",
						i, scope, cursor, h1, h3, seqs(evs), w.Foreign, p.Foreign, foreign)
				}
				if foreign && len(p.Events) != 0 && cursor > w.Head {
					t.Fatalf("cursor %d above the head: Read returned %v", cursor, seqs(p.Events))
				}
			}
		}
	}
	for _, c := range []int64{0, h1, evs[0].Sequence, evs[1].Sequence, h2, h3} {
		check(c, false)
	}
	for _, c := range []int64{1, h1 - 1, h2 + 1, (h2 + h3) / 2, h3 - 1, h3 + 1, h3 + 1000} {
		check(c, true)
	}
	// Appends go on above the new head; a cursor at the old head reads them.
	next := appendAll(t, s, ev("f4", "a", 5))[0]
	if next.Sequence <= h3 {
		t.Fatalf("sequence %d after the raised head %d", next.Sequence, h3)
	}
	check(h3-1, true)
	check(next.Sequence, false)
	if p := read(t, s2, storage.ReadRequest{After: h2}); p.Foreign || !slices.Equal(seqs(p.Events), []int64{next.Sequence}) {
		t.Fatalf("Read after %d: %v, Foreign %v; want [%d]", h2, seqs(p.Events), p.Foreign, next.Sequence)
	}
	w, err := s2.Window(ctxT(t), nil, h2, 10)
	if err != nil || w.Foreign || w.From <= h2 || w.From > next.Sequence || w.Head != next.Sequence {
		t.Fatalf("Window from %d: %+v, %v; want the window [%d]", h2, w, err, next.Sequence)
	}
}
