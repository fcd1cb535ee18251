package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/sqlitetest"
	"github.com/replayd/replayd/storage"
	"modernc.org/sqlite"
)

// A batch that fails because the database is busy fails as a whole: every
// event would fail alike, so retrying each alone would only multiply the
// wait for the lock by the batch size.
func TestAppendBusyFailsBatchOnce(t *testing.T) {
	saved := busyWait
	busyWait = 300 * time.Millisecond
	defer func() { busyWait = saved }()
	path := filepath.Join(t.TempDir(), "events.db")
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(50)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := openTestStore(t, db)
	mustAppend(t, s, "", "warm")
	holdWriteLock(t, path)
	const n = 8
	evs := make([]storage.Event, n)
	for i := range evs {
		evs[i] = storage.Event{EventID: fmt.Sprint("busy-", i), Type: "m", Topic: "a", Payload: json.RawMessage(`1`)}
	}
	start := time.Now()
	_, err = s.Append(context.Background(), evs)
	took := time.Since(start)
	var se *sqlite.Error
	if !errors.As(err, &se) || se.Code()&0xff != sqliteBusy {
		t.Fatalf("append: %v; want SQLITE_BUSY", err)
	}
	if limit := 3 * busyWait; took > limit {
		t.Fatalf("a busy batch of %d took %v to fail: more than %v, so the busy wait was repeated", n, took, limit)
	}
	t.Logf("a busy batch of %d failed in %v (busy wait %v)", n, took, busyWait)
}

// holdWriteLock takes the write lock of the database at path on a
// connection of its own, as another process would, until release is
// called (idempotent; it also runs at cleanup).
func holdWriteLock(t testing.TB, path string) (release func()) {
	t.Helper()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	return sqlitetest.HoldWriteLock(t, db)
}
