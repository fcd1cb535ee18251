package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/replayd/replayd/storage"
)

// openTestDB opens a fresh database file in t.TempDir and closes it at the
// end of the test.
func openTestDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.db")
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

// openTestStore opens the store over db, closed at the end of the test.
func openTestStore(t testing.TB, db *sql.DB) *Store {
	t.Helper()
	s, err := Open(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// secondStore opens the database file at path again, with its own pool, as
// another process would, and returns a store on it.
func secondStore(t testing.TB, path string) *Store {
	t.Helper()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return openTestStore(t, db)
}

var testIDs int

// mustAppend appends one event of topic, under id if given (else a fresh
// one), and returns the stored event.
func mustAppend(t testing.TB, s *Store, topic string, payload any, id ...string) storage.Event {
	t.Helper()
	data, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	ev := storage.Event{Type: "message", Topic: topic, Payload: data}
	if len(id) > 0 {
		ev.EventID = id[0]
	} else {
		testIDs++
		ev.EventID = fmt.Sprintf("test-%d", testIDs)
	}
	res, err := s.Append(context.Background(), []storage.Event{ev})
	if err != nil || res[0].Err != nil {
		t.Fatalf("append %q: %v %v", topic, err, res)
	}
	return res[0].Event
}

// logRow is one row of the events table, as eachNumbered reads it.
type logRow struct {
	seq, createdAt     int64
	id, topic, payload string // topic "" for a broadcast
}

// eachNumbered reads every row of the log in sequence order, fails the
// test unless ordinal and topic_ordinal number them 1, 2, 3, ... in the
// log and in each topic (broadcasts as one), calls fn with each, and
// returns how many there are.
func eachNumbered(t *testing.T, db *sql.DB, fn func(logRow)) int64 {
	t.Helper()
	rows, err := db.Query(`SELECT sequence, created_at, event_id, coalesce(topic, ''), payload, ordinal, topic_ordinal FROM events ORDER BY sequence`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n int64
	per := map[string]int64{}
	for rows.Next() {
		var r logRow
		var ord, tord int64
		if err := rows.Scan(&r.seq, &r.createdAt, &r.id, &r.topic, &r.payload, &ord, &tord); err != nil {
			t.Fatal(err)
		}
		n++
		per[r.topic]++
		if ord != n || tord != per[r.topic] {
			t.Fatalf("row %d (%s) of topic %q numbered %d/%d, want %d/%d", r.seq, r.id, r.topic, ord, tord, n, per[r.topic])
		}
		fn(r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
