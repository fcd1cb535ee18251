// Package sqlitetest holds helpers for tests over SQLite files, shared by
// the root package's tests and the SQLite store's.
package sqlitetest

import (
	"context"
	"database/sql"
	"sync"
	"testing"
)

// HoldWriteLock takes the write lock of db's file on a connection of its
// own, as another process would, until release is called. db is one the
// caller opened for this alone: release (idempotent, also run at the
// test's cleanup) rolls back and closes it.
func HoldWriteLock(t testing.TB, db *sql.DB) (release func()) {
	t.Helper()
	conn, err := db.Conn(context.Background())
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		conn.Close()
		db.Close()
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			conn.ExecContext(context.Background(), "ROLLBACK")
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(release)
	return release
}
