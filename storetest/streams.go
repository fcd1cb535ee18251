package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// The optional storage.StreamStore capability (Durable Streams' state):
// each subtest skips over a store without it.

// streamStore returns s as a StreamStore, or skips the test.
func streamStore(t *testing.T, s replayd.Store) storage.StreamStore {
	t.Helper()
	ss, ok := s.(storage.StreamStore)
	if !ok {
		t.Skipf("%T is not a storage.StreamStore", s)
	}
	return ss
}

func update(t *testing.T, ss storage.StreamStore, topics []string, fn func(tx storage.StreamTx) error) {
	t.Helper()
	if err := ss.UpdateStreams(ctxT(t), topics, fn); err != nil {
		t.Fatalf("UpdateStreams %v: %v", topics, err)
	}
}

func readStream(t *testing.T, ss storage.StreamStore, req storage.StreamReadRequest) storage.StreamPage {
	t.Helper()
	p, err := ss.ReadStream(ctxT(t), req)
	if err != nil {
		t.Fatalf("ReadStream %+v: %v", req, err)
	}
	return p
}

// stored reads, in a stream transaction, the record of topic and the state
// of its producer.
func stored(t *testing.T, ss storage.StreamStore, topic, producer string) (rec storage.StreamRecord, found bool, state []byte, hasState bool) {
	t.Helper()
	update(t, ss, []string{topic}, func(tx storage.StreamTx) error {
		var err error
		if rec, found, err = tx.Stream(ctxT(t), topic); err != nil {
			return err
		}
		state, hasState, err = tx.Producer(ctxT(t), topic, producer)
		return err
	})
	return rec, found, state, hasState
}

// txAppend appends evs through tx and returns the stored events.
func txAppend(ctx context.Context, tx storage.StreamTx, evs ...replayd.Event) ([]replayd.Event, error) {
	res, err := tx.Append(ctx, evs)
	if err != nil {
		return nil, err
	}
	if len(res) != len(evs) {
		return nil, fmt.Errorf("tx.Append: %d results for %d events", len(res), len(evs))
	}
	out := make([]replayd.Event, len(res))
	for i, r := range res {
		if r.Err != nil || r.Duplicate {
			return nil, fmt.Errorf("tx.Append: event %d (%s): %+v", i, evs[i].EventID, r)
		}
		out[i] = r.Event
	}
	return out, nil
}

// An UpdateStreams whose fn fails stores nothing of what fn wrote (record,
// producer state, events) and returns fn's error; one whose fn returns nil
// stores all of it, for every store.
func testStreamsAtomic(t *testing.T, open func() replayd.Store) {
	s := open()
	ss, ss2 := streamStore(t, s), streamStore(t, open())
	h0 := head(t, s)
	boom := errors.New("boom")
	write := func(tx storage.StreamTx) error {
		ctx := ctxT(t)
		if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "a", Meta: []byte("meta-1"), ExpiresAt: 42}); err != nil {
			return err
		}
		if err := tx.PutProducer(ctx, "a", "p1", []byte("state-1")); err != nil {
			return err
		}
		_, err := txAppend(ctx, tx, ev("at1", "a", 5), ev("at2", "a", 5))
		return err
	}
	err := ss.UpdateStreams(ctxT(t), []string{"a"}, func(tx storage.StreamTx) error {
		if err := write(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("UpdateStreams whose fn failed: %v, want fn's error", err)
	}
	for i, st := range []storage.StreamStore{ss, ss2} {
		if _, found, _, hasState := stored(t, st, "a", "p1"); found || hasState {
			t.Fatalf("store %d: after a rolled-back UpdateStreams: record %v, producer %v", i, found, hasState)
		}
		p := readStream(t, st, storage.StreamReadRequest{Topic: "a"})
		if p.Found || len(p.Events) != 0 || p.Last != 0 {
			t.Fatalf("store %d: after a rolled-back UpdateStreams: %+v", i, p)
		}
	}
	// The events' ids were not taken: the same events append as new.
	update(t, ss, []string{"a"}, write)
	for i, st := range []storage.StreamStore{ss, ss2} {
		rec, found, state, hasState := stored(t, st, "a", "p1")
		if !found || string(rec.Meta) != "meta-1" || rec.ExpiresAt != 42 || rec.Topic != "a" || !hasState || string(state) != "state-1" {
			t.Fatalf("store %d: after a committed UpdateStreams: record %+v (%v), producer %q (%v)", i, rec, found, state, hasState)
		}
		p := readStream(t, st, storage.StreamReadRequest{Topic: "a"})
		if !p.Found || len(p.Events) != 2 || p.Events[0].EventID != "at1" || p.Events[1].EventID != "at2" || p.Events[0].Sequence <= h0 {
			t.Fatalf("store %d: after a committed UpdateStreams: %+v", i, p)
		}
	}
}

// The record and the producer states round trip; PutStream and PutProducer
// replace; DeleteStream removes the record and the topic's producers
// only; Last is the topic's newest event, broadcasts and other topics
// aside.
func testStreamsRoundTrip(t *testing.T, open func() replayd.Store) {
	s := open()
	ss := streamStore(t, s)
	ctx := ctxT(t)
	update(t, ss, []string{"a", "b"}, func(tx storage.StreamTx) error {
		if _, found, err := tx.Stream(ctx, "a"); err != nil || found {
			return fmt.Errorf("tx.Stream of a topic without one: %v, %v", found, err)
		}
		if _, found, err := tx.Producer(ctx, "a", "p"); err != nil || found {
			return fmt.Errorf("tx.Producer never put: %v, %v", found, err)
		}
		if last, err := tx.Last(ctx, "a"); err != nil || last != 0 {
			return fmt.Errorf("tx.Last of a topic without events: %d, %v", last, err)
		}
		for _, rec := range []storage.StreamRecord{{Topic: "a", Meta: []byte("a1")}, {Topic: "a", Meta: []byte("a2"), ExpiresAt: 7}, {Topic: "b", Meta: []byte("b1"), ExpiresAt: 9}} {
			if err := tx.PutStream(ctx, rec); err != nil {
				return err
			}
		}
		rec, found, err := tx.Stream(ctx, "a")
		if err != nil || !found || string(rec.Meta) != "a2" || rec.ExpiresAt != 7 || rec.Topic != "a" {
			return fmt.Errorf("tx.Stream after two PutStreams: %+v, %v, %v", rec, found, err)
		}
		for _, p := range []struct{ topic, id, state string }{{"a", "p", "1"}, {"a", "p", "2"}, {"a", "q", "q1"}, {"b", "p", "b"}} {
			if err := tx.PutProducer(ctx, p.topic, p.id, []byte(p.state)); err != nil {
				return err
			}
		}
		state, found, err := tx.Producer(ctx, "a", "p")
		if err != nil || !found || string(state) != "2" {
			return fmt.Errorf("tx.Producer after two PutProducers: %q, %v, %v", state, found, err)
		}
		return nil
	})
	// Last: the topic's own newest event, whoever appended it.
	before := appendAll(t, s, ev("l1", "a", 5), ev("l2", "b", 5), ev("l3", "", 5))
	update(t, ss, []string{"a"}, func(tx storage.StreamTx) error {
		if last, err := tx.Last(ctx, "a"); err != nil || last != before[0].Sequence {
			return fmt.Errorf("tx.Last of a: %d, %v; want %d", last, err, before[0].Sequence)
		}
		evs, err := txAppend(ctx, tx, ev("l4", "a", 5), ev("l5", "", 5))
		if err != nil {
			return err
		}
		if last, err := tx.Last(ctx, "a"); err != nil || last != evs[0].Sequence {
			return fmt.Errorf("tx.Last of a after an Append in the transaction: %d, %v; want %d", last, err, evs[0].Sequence)
		}
		return tx.DeleteStream(ctx, "a")
	})
	update(t, ss, []string{"a", "b"}, func(tx storage.StreamTx) error {
		if _, found, err := tx.Stream(ctx, "a"); err != nil || found {
			return fmt.Errorf("tx.Stream after DeleteStream: %v, %v", found, err)
		}
		for _, id := range []string{"p", "q"} {
			if _, found, err := tx.Producer(ctx, "a", id); err != nil || found {
				return fmt.Errorf("tx.Producer %s after DeleteStream: %v, %v", id, found, err)
			}
		}
		if rec, found, err := tx.Stream(ctx, "b"); err != nil || !found || string(rec.Meta) != "b1" || rec.ExpiresAt != 9 {
			return fmt.Errorf("another topic's record after DeleteStream: %+v, %v, %v", rec, found, err)
		}
		if state, found, err := tx.Producer(ctx, "b", "p"); err != nil || !found || string(state) != "b" {
			return fmt.Errorf("another topic's producer after DeleteStream: %q, %v, %v", state, found, err)
		}
		// The topic's events stay.
		if last, err := tx.Last(ctx, "a"); err != nil || last == 0 {
			return fmt.Errorf("tx.Last after DeleteStream: %d, %v", last, err)
		}
		return nil
	})
}

// A transaction that can read many records in one statement
// (storage.StreamsReader) returns exactly the records of the topics named
// that have one, as the transaction sees them: its own puts and deletes
// included, a topic named twice once, topics of any spelling.
func testStreamsMany(t *testing.T, open func() replayd.Store) {
	ss := streamStore(t, open())
	ctx := ctxT(t)
	topics := []string{"a", `q"u'o,t[e]`, "ünï/cødé", "100%_", "b"}
	for i := range 300 {
		topics = append(topics, fmt.Sprintf("many-%03d", i))
	}
	// got reads topics' records through tx as topic -> meta.
	got := func(tx storage.StreamTx, topics []string) (map[string]string, error) {
		sr, ok := tx.(storage.StreamsReader)
		if !ok {
			return nil, errSkip
		}
		recs, err := sr.Streams(ctx, topics)
		if err != nil {
			return nil, err
		}
		m := map[string]string{}
		for _, rec := range recs {
			if _, dup := m[rec.Topic]; dup {
				return nil, fmt.Errorf("tx.Streams returned %q twice", rec.Topic)
			}
			m[rec.Topic] = fmt.Sprintf("%s@%d", rec.Meta, rec.ExpiresAt)
		}
		return m, nil
	}
	want := map[string]string{}
	ask := append([]string{"absent", "a"}, topics...)
	err := ss.UpdateStreams(ctx, topics, func(tx storage.StreamTx) error {
		m, err := got(tx, ask)
		if errors.Is(err, errSkip) {
			return err
		}
		if err != nil || len(m) != 0 {
			return fmt.Errorf("tx.Streams before any put: %v, %v", m, err)
		}
		for i, topic := range topics {
			if i%3 == 2 {
				continue
			}
			rec := storage.StreamRecord{Topic: topic, Meta: []byte("m" + topic), ExpiresAt: int64(i)}
			if err := tx.PutStream(ctx, rec); err != nil {
				return err
			}
			want[topic] = fmt.Sprintf("m%s@%d", topic, i)
		}
		if m, err := got(tx, ask); err != nil || !maps.Equal(m, want) {
			return fmt.Errorf("tx.Streams after the puts, in their transaction: %d records (%v), want %d", len(m), err, len(want))
		}
		return nil
	})
	if errors.Is(err, errSkip) {
		t.Skipf("a stream transaction of %T is not a storage.StreamsReader", ss)
	}
	if err != nil {
		t.Fatal(err)
	}
	update(t, ss, topics, func(tx storage.StreamTx) error {
		if m, err := got(tx, ask); err != nil || !maps.Equal(m, want) {
			return fmt.Errorf("tx.Streams after the commit: %d records (%v), want %d", len(m), err, len(want))
		}
		if err := tx.DeleteStream(ctx, "a"); err != nil {
			return err
		}
		delete(want, "a")
		if m, err := got(tx, []string{"a", "b"}); err != nil || !maps.Equal(m, map[string]string{"b": want["b"]}) {
			return fmt.Errorf("tx.Streams of a deleted and a kept record: %v, %v", m, err)
		}
		return nil
	})
}

// errSkip is returned by a test's fn to skip it.
var errSkip = errors.New("skip")

// Events appended in a stream transaction get sequences above the head
// and the transaction's earlier appends, and no reader (another store's
// Read, ReadStream or Head) sees them, nor the record, before the commit;
// after it, every store does.
func testStreamsAppendVisibility(t *testing.T, open func() replayd.Store) {
	s, other := open(), open()
	ss, oss := streamStore(t, s), streamStore(t, other)
	h0 := appendAll(t, other, ev("v0", "", 5))[0].Sequence
	var evs []replayd.Event
	update(t, ss, []string{"a"}, func(tx storage.StreamTx) error {
		ctx := ctxT(t)
		first, err := txAppend(ctx, tx, ev("v1", "a", 5), ev("v2", "a", 5))
		if err != nil {
			return err
		}
		second, err := txAppend(ctx, tx, ev("v3", "a", 5))
		if err != nil {
			return err
		}
		evs = append(first, second...)
		if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "a", Meta: []byte("m")}); err != nil {
			return err
		}
		prev := h0
		for _, e := range evs {
			if e.Sequence <= prev {
				return fmt.Errorf("sequences %v after the head %d", seqs(evs), h0)
			}
			prev = e.Sequence
		}
		p, err := other.Read(ctx, storage.ReadRequest{After: h0})
		if err != nil || len(p.Events) != 0 || p.Head != h0 {
			return fmt.Errorf("another store's Read before the commit: %v, head %d, %v", seqs(p.Events), p.Head, err)
		}
		sp, err := oss.ReadStream(ctx, storage.StreamReadRequest{Topic: "a"})
		if err != nil || sp.Found || len(sp.Events) != 0 || sp.Last != 0 || sp.Head != h0 {
			return fmt.Errorf("another store's ReadStream before the commit: %+v, %v", sp, err)
		}
		return nil
	})
	for i, st := range []storage.StreamStore{ss, oss} {
		p := readStream(t, st, storage.StreamReadRequest{Topic: "a"})
		last := evs[len(evs)-1].Sequence
		if !p.Found || !slices.Equal(seqs(p.Events), seqs(evs)) || p.Last != last || p.Head != last {
			t.Fatalf("store %d after the commit: %+v, want events %v", i, p, seqs(evs))
		}
		for j := range evs {
			if !sameEvent(p.Events[j], evs[j]) {
				t.Fatalf("store %d: event %d is %+v, want %+v", i, j, p.Events[j], evs[j])
			}
		}
	}
}

// ReadStream agrees with a model: the record, the topic's own events in
// (After, Through] (never broadcasts nor other topics) cut by Limit and
// MaxBytes with More, At, Last, the topic's own watermark after prunes,
// the head, and Foreign for cursors above the head or inside the range
// the sequence floor skipped.
func testStreamsRead(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	ss, ss2 := streamStore(t, s), streamStore(t, s2)
	rng := rand.New(rand.NewPCG(7, 8))
	m := randomLog(t, rng, s, s2, 60, "sr")
	// Stream transactions append to "a" among the rest.
	for i := range 10 {
		st := []storage.StreamStore{ss, ss2}[i%2]
		batch := []replayd.Event{ev(fmt.Sprintf("sra%d", i), "a", 3+rng.IntN(40)), ev(fmt.Sprintf("srb%d", i), "", 5)}
		var evs []replayd.Event
		update(t, st, []string{"a"}, func(tx storage.StreamTx) error {
			var err error
			evs, err = txAppend(ctxT(t), tx, batch...)
			return err
		})
		m.add(evs...)
		m.add(appendAll(t, s, ev(fmt.Sprintf("src%d", i), "b", 8))...)
	}
	update(t, ss, []string{"a"}, func(tx storage.StreamTx) error {
		return tx.PutStream(ctxT(t), storage.StreamRecord{Topic: "a", Meta: []byte("rec"), ExpiresAt: 5})
	})
	check := func() {
		t.Helper()
		for range 150 {
			topic := []string{"a", "a", "b", "c", "nobody"}[rng.IntN(5)]
			req := storage.StreamReadRequest{Topic: topic, After: m.cursor(rng, 2), Limit: []int{0, 1, 2, 5, 17, 1000}[rng.IntN(6)]}
			if rng.IntN(2) == 0 {
				req.Through = req.After + rng.Int64N(m.head+3-req.After)
			}
			if rng.IntN(3) == 0 {
				req.MaxBytes = 1 + rng.IntN(80)
			}
			if rng.IntN(6) == 0 { // a sequence of another topic, or a broadcast
				req.After = m.evs[rng.IntN(len(m.evs))].Sequence
			}
			checkReadStream(t, []storage.StreamStore{ss, ss2}[rng.IntN(2)], m, req)
		}
	}
	check()
	// After prunes, of what is left, with the topic's own watermark.
	for _, keep := range []int64{70, 25} {
		n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: keep})
		if err != nil || n != int64(len(m.evs))-keep {
			t.Fatalf("Prune MaxEvents %d of %d: %d, %v", keep, len(m.evs), n, err)
		}
		m.prunePrefix(int(n))
		check()
	}
	// Cursors the sequence floor skipped (the log was opened at m.floor, so
	// (0, m.floor) was never issued), and above the head, are foreign.
	for _, after := range []int64{1, m.floor - 1, m.head + 1, m.head + 1000} {
		checkReadStream(t, ss, m, storage.StreamReadRequest{Topic: "a", After: after, Limit: 10})
	}
}

// checkReadStream compares ReadStream's answer with the model's.
func checkReadStream(t *testing.T, ss storage.StreamStore, m *model, req storage.StreamReadRequest) {
	t.Helper()
	through := req.Through
	if through == 0 {
		through = 1<<63 - 1
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 100
	}
	var all, want []replayd.Event
	var last int64
	at := false
	for _, e := range m.evs {
		if e.Topic != req.Topic {
			continue
		}
		last = e.Sequence
		at = at || (req.After > 0 && e.Sequence == req.After)
		if e.Sequence > req.After && e.Sequence <= through {
			all = append(all, e)
		}
	}
	size := 0
	for _, e := range all {
		if len(want) == limit || (req.MaxBytes > 0 && size >= req.MaxBytes) {
			break
		}
		want = append(want, e)
		size += len(e.Payload)
	}
	foreign := req.After > m.head || (req.After > 0 && req.After < m.floor)
	p := readStream(t, ss, req)
	desc := func() string {
		return fmt.Sprintf("ReadStream %+v = events %v More %v At %v Last %d Watermark %d Head %d Foreign %v Found %v",
			req, seqs(p.Events), p.More, p.At, p.Last, p.Watermark, p.Head, p.Foreign, p.Found)
	}
	if !foreign || req.After <= m.head {
		// Above the head a store may return nothing at all; below it, the
		// events are the model's.
		if !slices.Equal(seqs(p.Events), seqs(want)) {
			t.Fatalf("%s: events want %v", desc(), seqs(want))
		}
		for i := range want {
			if !sameEvent(p.Events[i], want[i]) {
				t.Fatalf("%s: event %d is %+v, want %+v", desc(), i, p.Events[i], want[i])
			}
		}
		if more := len(all) > len(want); p.More != more {
			t.Fatalf("%s: More want %v", desc(), more)
		}
	} else if len(p.Events) != 0 {
		t.Fatalf("%s: events above the head", desc())
	}
	if p.At != at || p.Last != last || p.Head != m.head || p.Foreign != foreign {
		t.Fatalf("%s: want At %v Last %d Head %d Foreign %v", desc(), at, last, m.head, foreign)
	}
	if w := m.marks[req.Topic]; p.Watermark != w {
		t.Fatalf("%s: Watermark want %d (marks %v)", desc(), w, m.marks)
	}
	if found := req.Topic == "a"; p.Found != found || (found && (string(p.Record.Meta) != "rec" || p.Record.ExpiresAt != 5 || p.Record.Topic != "a")) {
		t.Fatalf("%s: record %+v, want found %v", desc(), p.Record, found)
	}
}

// Stream transactions of one topic are serialised, over stores: goroutines
// on two stores each increment a counter held in the record (read, then
// write) and append an event, and no increment is lost. Transactions
// naming {a, b} and {b, a} at once never deadlock.
func testStreamsSerialised(t *testing.T, open func() replayd.Store) {
	sts := []storage.StreamStore{streamStore(t, open()), streamStore(t, open())}
	const goroutines, each = 6, 15
	incr := func(ctx context.Context, tx storage.StreamTx, topic, id string) error {
		rec, _, err := tx.Stream(ctx, topic)
		if err != nil {
			return err
		}
		n := 0
		if len(rec.Meta) > 0 {
			if n, err = strconv.Atoi(string(rec.Meta)); err != nil {
				return err
			}
		}
		if _, err := txAppend(ctx, tx, ev(id, topic, 5)); err != nil {
			return err
		}
		return tx.PutStream(ctx, storage.StreamRecord{Topic: topic, Meta: []byte(strconv.Itoa(n + 1))})
	}
	run := func(name string, topicsOf func(g, i int) []string) {
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					names := topicsOf(g, i)
					err := sts[g%2].UpdateStreams(ctx, names, func(tx storage.StreamTx) error {
						for _, topic := range names {
							if err := incr(ctx, tx, topic, fmt.Sprintf("%s-%s-%d-%d", name, topic, g, i)); err != nil {
								return err
							}
						}
						return nil
					})
					if err != nil {
						errs <- fmt.Errorf("goroutine %d, update %d on %v: %w", g, i, names, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	counter := func(topic string) int {
		t.Helper()
		p := readStream(t, sts[1], storage.StreamReadRequest{Topic: topic, Limit: 1000})
		n, err := strconv.Atoi(string(p.Record.Meta))
		if err != nil || !p.Found {
			t.Fatalf("record of %s: %+v, %v", topic, p.Record, err)
		}
		if len(p.Events) != n {
			t.Fatalf("%s: counter %d, but %d events appended", topic, n, len(p.Events))
		}
		return n
	}
	run("one", func(g, i int) []string { return []string{"n"} })
	if n := counter("n"); n != goroutines*each {
		t.Fatalf("counter of one topic: %d after %d increments: updates were lost", n, goroutines*each)
	}
	run("two", func(g, i int) []string {
		if (g+i)%2 == 0 {
			return []string{"x", "y"}
		}
		return []string{"y", "x"}
	})
	for _, topic := range []string{"x", "y"} {
		if n := counter(topic); n != goroutines*each {
			t.Fatalf("counter of %s: %d after %d increments: updates were lost", topic, n, goroutines*each)
		}
	}
}

// errRollback is a test's fn error, which rolls its transaction back.
var errRollback = errors.New("storetest: roll back")

// DueStreams lists the records whose ExpiresAt is above 0 and at or below
// now, the earliest first, then by topic, at most limit, as they are after
// the last commit (a record put again with another ExpiresAt, or deleted,
// moves or leaves), from any store of the log.
func testStreamsDue(t *testing.T, open func() replayd.Store) {
	s := open()
	ss := streamStore(t, s)
	other := streamStore(t, open())
	ctx := ctxT(t)
	due := func(ss storage.StreamStore, now int64, limit int) string {
		t.Helper()
		recs, err := ss.DueStreams(ctx, now, limit)
		if err != nil {
			t.Fatalf("DueStreams(%d, %d): %v", now, limit, err)
		}
		var out []string
		for _, r := range recs {
			out = append(out, fmt.Sprintf("%s:%s@%d", r.Topic, r.Meta, r.ExpiresAt))
		}
		return fmt.Sprint(out)
	}
	if got := due(ss, 1<<62, 0); got != "[]" {
		t.Fatalf("DueStreams of a log without records: %s", got)
	}
	recs := []storage.StreamRecord{
		{Topic: "never", Meta: []byte("n")},
		{Topic: "c", Meta: []byte("c"), ExpiresAt: 20},
		{Topic: "b", Meta: []byte("b"), ExpiresAt: 10},
		{Topic: "a", Meta: []byte("a"), ExpiresAt: 10},
		{Topic: "first", Meta: []byte("f"), ExpiresAt: 1},
		{Topic: "moved", Meta: []byte("m"), ExpiresAt: 2},
		{Topic: "deleted", Meta: []byte("d"), ExpiresAt: 3},
	}
	topics := make([]string, len(recs))
	for i, r := range recs {
		topics[i] = r.Topic
	}
	update(t, ss, topics, func(tx storage.StreamTx) error {
		for _, r := range recs {
			if err := tx.PutStream(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	update(t, ss, []string{"moved", "deleted"}, func(tx storage.StreamTx) error {
		if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "moved", Meta: []byte("m2")}); err != nil {
			return err
		}
		return tx.DeleteStream(ctx, "deleted")
	})
	for _, c := range []struct {
		now   int64
		limit int
		want  string
	}{
		{0, 10, "[]"},
		{1, 10, "[first:f@1]"},
		{9, 10, "[first:f@1]"},
		{10, 10, "[first:f@1 a:a@10 b:b@10]"},
		{10, 2, "[first:f@1 a:a@10]"},
		{1 << 62, 10, "[first:f@1 a:a@10 b:b@10 c:c@20]"},
		{1 << 62, -1, "[first:f@1 a:a@10 b:b@10 c:c@20]"},
	} {
		for i, st := range []storage.StreamStore{ss, other} {
			if got := due(st, c.now, c.limit); got != c.want {
				t.Errorf("store %d: DueStreams(%d, %d) = %s, want %s", i, c.now, c.limit, got, c.want)
			}
		}
	}
	// A transaction that rolls back changes nothing.
	err := ss.UpdateStreams(ctx, []string{"never"}, func(tx storage.StreamTx) error {
		if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "never", Meta: []byte("n"), ExpiresAt: 1}); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("UpdateStreams whose fn failed: %v", err)
	}
	if got := due(other, 1, 10); got != "[first:f@1]" {
		t.Fatalf("DueStreams after a rollback: %s", got)
	}
}
