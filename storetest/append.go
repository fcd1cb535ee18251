package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

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
