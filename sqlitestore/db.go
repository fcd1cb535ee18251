package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"modernc.org/sqlite" // registers the "sqlite" driver
)

// busyTimeoutMillis is how long a connection waits for another process's
// write lock before SQLITE_BUSY.
const busyTimeoutMillis = 10000

// OpenDB opens a SQLite database for a hub with modernc.org/sqlite (pure
// Go, no cgo): "events.db", "file:events.db?…" or ":memory:".
//
// A file gets WAL, a busy timeout of 10s, synchronous=NORMAL (a commit
// survives a crash of the process; an OS crash may lose the newest
// commits), and a pool of a few connections, so readers run beside the one
// writer. ":memory:" is a single database shared by the whole pool: the
// pool is pinned to one connection, which serialises every use, since each
// SQLite connection to ":memory:" would otherwise get its own empty
// database. Close the *sql.DB when you are done; the hub never does.
func OpenDB(dsn string) (*sql.DB, error) {
	if dsn == "" {
		return nil, fmt.Errorf("replayd: open db: empty dsn")
	}
	memory := dsn == ":memory:"
	pragmas := []string{fmt.Sprintf("busy_timeout(%d)", busyTimeoutMillis)}
	if !memory {
		pragmas = append(pragmas, "journal_mode(WAL)", "synchronous(NORMAL)")
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	full := dsn
	for _, p := range pragmas {
		full += sep + "_pragma=" + p
		sep = "&"
	}
	db, err := sql.Open("sqlite", full)
	if err != nil {
		return nil, fmt.Errorf("replayd: open db: %w", err)
	}
	conns := 1
	if !memory {
		conns = max(4, 2*runtime.GOMAXPROCS(0))
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	// Opening a connection applies the pragmas, and journal_mode can meet
	// another process's lock (a checkpoint, a WAL recovery) that SQLite
	// answers with SQLITE_BUSY at once: retried like a busy transaction.
	if err := retryBusy(context.Background(), db.Ping); err != nil {
		db.Close()
		return nil, fmt.Errorf("replayd: open db %q: %w", dsn, err)
	}
	return db, nil
}

// busyWait bounds how long a write waits for another process's write lock
// (retryBusy); a variable so tests can shorten it.
var busyWait = busyTimeoutMillis * time.Millisecond

// rowError reports whether err is about one row of a batch (a constraint,
// such as a trigger's RAISE, or a value too big or of the wrong type), which
// retrying each event alone isolates.
func rowError(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqliteConstraint, sqliteTooBig, sqliteMismatch:
		return true
	}
	return false
}

// SQLite primary result codes of errors about a row.
const (
	sqliteTooBig     = 18
	sqliteConstraint = 19
	sqliteMismatch   = 20
)
