package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd/storage"
)

// Batches of every size go in multi-row INSERTs (insertRun), two stores
// taking turns on one file as two processes would. Some events repeat an
// id stored earlier, or one earlier in the same batch, and a trigger
// refuses some: each result must be what the log holds, each refused event
// must fail alone, and the numbering must stay without holes.
func TestAppendRunsNumberAndFindDuplicates(t *testing.T) {
	db, path := openTestDB(t)
	stores := []*Store{openTestStore(t, db), secondStore(t, path)}
	if _, err := db.Exec(`CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.payload = '"refused"'
		BEGIN SELECT RAISE(ABORT, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	var ids []string // every id stored so far
	stored := map[string]storage.Event{}
	var refused, dups, n int
	for round := range 120 {
		size := 1 + rng.IntN(50)
		if round%10 == 0 {
			size = 16 + rng.IntN(3) // a run and a remainder
		}
		evs := make([]storage.Event, size)
		for i := range evs {
			n++
			ev := storage.Event{EventID: fmt.Sprint("ev-", n), Type: "message", Topic: []string{"a", "b", "c", ""}[rng.IntN(4)],
				Payload: json.RawMessage(fmt.Sprint(n))}
			switch k := rng.IntN(100); {
			case k < 3 && len(ids) > 0:
				ev.EventID = ids[rng.IntN(len(ids))] // stored before
			case k < 5 && i > 0:
				ev.EventID = evs[rng.IntN(i)].EventID // earlier in this batch
			case k < 7:
				ev.Payload = json.RawMessage(`"refused"`)
			}
			evs[i] = ev
		}
		res, err := stores[round%2].Append(ctx, evs)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		last := int64(0)
		for i, r := range res {
			ev := evs[i]
			orig, seen := stored[ev.EventID]
			switch {
			case string(ev.Payload) == `"refused"` && !seen:
				if r.Err == nil || !strings.Contains(r.Err.Error(), "refused") {
					t.Fatalf("round %d, event %d: refused row gave %+v", round, i, r)
				}
				refused++
				continue
			case r.Err != nil:
				t.Fatalf("round %d, event %d (%s): %v", round, i, ev.EventID, r.Err)
			case seen:
				if !r.Duplicate || r.Event.Sequence != orig.Sequence || string(r.Event.Payload) != string(orig.Payload) {
					t.Fatalf("round %d, event %d: repeated id %s gave %+v, want the original %+v", round, i, ev.EventID, r, orig)
				}
				dups++
				continue
			case r.Duplicate:
				t.Fatalf("round %d, event %d: a new id reported a duplicate", round, i)
			}
			if r.Event.Sequence <= last || r.Event.EventID != ev.EventID || string(r.Event.Payload) != string(ev.Payload) {
				t.Fatalf("round %d, event %d: %+v after sequence %d", round, i, r.Event, last)
			}
			last = r.Event.Sequence
			stored[ev.EventID] = r.Event
			ids = append(ids, ev.EventID)
		}
	}
	if refused == 0 || dups == 0 {
		t.Fatalf("%d refused and %d duplicates: the test lost its point", refused, dups)
	}
	// The log holds exactly what the results said, numbered without holes.
	count := eachNumbered(t, db, func(r logRow) {
		if ev, ok := stored[r.id]; !ok || ev.Sequence != r.seq || string(ev.Payload) != r.payload {
			t.Fatalf("row %d (%s, %s) is not what Append returned: %+v", r.seq, r.id, r.payload, ev)
		}
	})
	if count != int64(len(stored)) {
		t.Fatalf("%d rows, %d stored events", count, len(stored))
	}
	t.Logf("%d events stored, %d duplicates, %d refused", count, dups, refused)
}

// A multi-row INSERT that a trigger cuts short without an error cannot be
// told apart row by row: the batch fails whole and stores nothing.
func TestAppendRunWithAnIgnoredRowFailsWhole(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	if _, err := db.Exec(`CREATE TRIGGER skip BEFORE INSERT ON events WHEN NEW.payload = '"skip"'
		BEGIN SELECT RAISE(IGNORE); END`); err != nil {
		t.Fatal(err)
	}
	evs := make([]storage.Event, 16)
	for i := range evs {
		evs[i] = storage.Event{EventID: fmt.Sprint("e", i), Type: "m", Payload: json.RawMessage(`1`)}
	}
	evs[5].Payload = json.RawMessage(`"skip"`)
	if _, err := s.Append(context.Background(), evs); err == nil {
		t.Fatal("Append succeeded although a row was dropped")
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM events`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows stored (%v), want none", n, err)
	}
}

// Append waits for the store's other writes (a prune batch, the Ready
// probe) only as long as its ctx lasts.
func TestAppendGivesUpWaitingForTheStoreWithItsContext(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Append(ctx, []storage.Event{{EventID: "x", Type: "m", Payload: json.RawMessage(`1`)}})
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > 5*time.Second {
		t.Fatalf("Append returned %v after %v; want its ctx's error", err, took)
	}
}

// The writer's connection goes back to the pool as it came: its
// busy_timeout and temp_store, changed while the writer holds it, are set
// back when the store closes.
func TestWriterGivesItsConnectionBackAsItCame(t *testing.T) {
	db, _ := openTestDB(t)
	db.SetMaxOpenConns(2)
	ctx := context.Background()
	s, err := Open(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, "a", 1)
	var busy, temp int64
	if err := s.writer.conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != 0 {
		t.Fatalf("the writer's busy_timeout is %d (%v), want 0", busy, err)
	}
	s.Close()
	conns := make([]*sql.Conn, 2) // every connection of the pool
	for i := range conns {
		if conns[i], err = db.Conn(ctx); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
	}
	for i, c := range conns {
		if err := c.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, "PRAGMA temp_store").Scan(&temp); err != nil {
			t.Fatal(err)
		}
		if busy != busyTimeoutMillis || temp != 0 {
			t.Fatalf("connection %d: busy_timeout %d, temp_store %d; want %d and 0, as OpenDB made it", i, busy, temp, busyTimeoutMillis)
		}
	}
}
