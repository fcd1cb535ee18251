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
