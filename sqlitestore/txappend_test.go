package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/replayd/replayd/storage"
)

// TestAppendTxNumbering interleaves the writer's Append, AppendTx in
// committed and rolled-back transactions, and a second store on the file
// (another process's writer, whose ordinal cache the transactions must
// invalidate), then checks what insertRows promises of every row: sequences
// ascending and above the floor, ordinals 1, 2, 3, ... in the log and in
// each topic (broadcasts as one topic), created_at never decreasing, each
// event id once, and nothing of the rolled-back transactions.
func TestAppendTxNumbering(t *testing.T) {
	db, path := openTestDB(t)
	s := openTestStore(t, db)
	other := secondStore(t, path)
	ctx := context.Background()
	head0, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	topics := []string{"", "a", "b", "c"}
	event := func(i int) storage.Event {
		return storage.Event{EventID: fmt.Sprintf("e%d", i), Type: "message", Topic: topics[rng.IntN(len(topics))], Payload: []byte(fmt.Sprint(i))}
	}
	committed := map[string]int64{}
	rolledBack := map[string]bool{}
	for i := 0; i < 400; i++ {
		switch r := rng.IntN(4); r {
		case 0, 1: // the writers of both stores, their caches warm
			w := s
			if r == 1 {
				w = other
			}
			ev := event(i)
			res, err := w.Append(ctx, []storage.Event{ev})
			if err != nil || res[0].Err != nil {
				t.Fatal(err, res)
			}
			committed[ev.EventID] = res[0].Event.Sequence
		default: // a transaction of one to three events, one in three rolled back
			tx, err := s.BeginTx(ctx)
			if err != nil {
				t.Fatal(err)
			}
			evs := []storage.Event{event(i)}
			for k := rng.IntN(3); k > 0; k-- {
				i++
				evs = append(evs, event(i))
			}
			res, err := s.AppendTx(ctx, tx, evs)
			if err != nil {
				t.Fatal(err)
			}
			if rng.IntN(3) == 0 {
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				for _, ev := range evs {
					rolledBack[ev.EventID] = true
				}
				continue
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			for j, r := range res {
				if r.Duplicate || r.Event.EventID != evs[j].EventID || r.Event.CreatedAt.IsZero() {
					t.Fatalf("result %+v for %+v", r, evs[j])
				}
				committed[r.Event.EventID] = r.Event.Sequence
			}
		}
	}
	var prevSeq, prevAt int64 = head0, 0
	seen := map[string]bool{}
	eachNumbered(t, db, func(r logRow) {
		switch {
		case r.seq <= prevSeq:
			t.Fatalf("sequence %d after %d", r.seq, prevSeq)
		case r.createdAt < prevAt:
			t.Fatalf("row %d: created_at %d below %d", r.seq, r.createdAt, prevAt)
		case rolledBack[r.id]:
			t.Fatalf("rolled-back event %s is in the log", r.id)
		case committed[r.id] != r.seq || seen[r.id]:
			t.Fatalf("row %d: event %s, committed as %d (seen %v)", r.seq, r.id, committed[r.id], seen[r.id])
		}
		seen[r.id], prevSeq, prevAt = true, r.seq, r.createdAt
	})
	if len(seen) != len(committed) || len(rolledBack) == 0 {
		t.Fatalf("%d rows for %d committed events (%d rolled back)", len(seen), len(committed), len(rolledBack))
	}
}

// TestAppendTxDuplicate: an event id stored by Append, or earlier in the
// same transaction, stores nothing and returns the original.
func TestAppendTxDuplicate(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	ctx := context.Background()
	orig := mustAppend(t, s, "a", 1, "x")
	tx, err := s.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	res, err := s.AppendTx(ctx, tx, []storage.Event{
		{EventID: "x", Type: "message", Topic: "b", Payload: []byte("2")},
		{EventID: "y", Type: "message", Topic: "b", Payload: []byte("3")},
		{EventID: "y", Type: "other", Topic: "c", Payload: []byte("4")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Duplicate || res[0].Event.Sequence != orig.Sequence || string(res[0].Event.Payload) != "1" {
		t.Fatalf("duplicate of an appended id: %+v, want %+v", res[0], orig)
	}
	if res[1].Duplicate || !res[2].Duplicate || res[2].Event.Sequence != res[1].Event.Sequence || res[2].Event.Topic != "b" {
		t.Fatalf("an id twice in one transaction: %+v", res[1:])
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// The writer appends after the transaction, above it, and a retry of
	// its id through Append returns it.
	r, err := s.Append(ctx, []storage.Event{{EventID: "y", Type: "message", Topic: "b", Payload: []byte("5")}, {EventID: "z", Type: "message", Topic: "b", Payload: []byte("6")}})
	if err != nil {
		t.Fatal(err)
	}
	if !r[0].Duplicate || r[0].Event.Sequence != res[1].Event.Sequence || r[1].Event.Sequence <= res[1].Event.Sequence {
		t.Fatalf("Append after the transaction: %+v", r)
	}
	var tord int64
	if err := db.QueryRow(`SELECT topic_ordinal FROM events WHERE event_id = 'z'`).Scan(&tord); err != nil || tord != 2 {
		t.Fatalf("topic ordinal of z: %d, %v; want 2", tord, err)
	}
}

// TestBeginTxWaitsForAnotherWriter: BeginTx takes the write lock, waiting
// for another process's transaction within the busy timeout.
func TestBeginTxWaitsForAnotherWriter(t *testing.T) {
	db, path := openTestDB(t)
	s := openTestStore(t, db)
	other := secondStore(t, path)
	ctx := context.Background()
	held, err := other.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *sql.Tx, 1)
	go func() {
		tx, err := s.BeginTx(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- tx
	}()
	select {
	case <-got:
		t.Fatal("BeginTx took the write lock another transaction holds")
	case <-time.After(200 * time.Millisecond):
	}
	held.Rollback()
	select {
	case tx := <-got:
		if tx != nil {
			tx.Rollback()
		}
	case <-time.After(10 * time.Second):
		t.Fatal("BeginTx did not get the lock after the other transaction ended")
	}
}
