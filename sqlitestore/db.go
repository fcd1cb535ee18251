package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
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

// writeTx runs fn inside BEGIN IMMEDIATE on one pooled connection, so the
// write lock is taken up front and a busy database is waited for by the busy
// timeout instead of failing a deferred transaction's upgrade.
func (s *Store) writeTx(ctx context.Context, fn func(*sql.Conn) error) (err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := retryBusy(ctx, func() error {
		_, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		return err
	}); err != nil {
		return err
	}
	if err := fn(conn); err != nil {
		// Rollback with a fresh context: a cancelled one must not leave the
		// connection inside a transaction when it goes back to the pool.
		if _, rerr := conn.ExecContext(context.Background(), "ROLLBACK"); rerr != nil {
			discard(conn)
		}
		return err
	}
	if _, err := conn.ExecContext(context.Background(), "COMMIT"); err != nil {
		if _, rerr := conn.ExecContext(context.Background(), "ROLLBACK"); rerr != nil {
			discard(conn)
		}
		return err
	}
	return nil
}

// retryBusy runs begin, a BEGIN IMMEDIATE, until it gets the write lock,
// for at most busyWait, and stops early when ctx ends. The writer's
// connection has its busy timeout off (see logWriter.append), so the
// waiting happens here; elsewhere it retries a busy answer that outlived
// the connection's busy timeout, or came on a *sql.DB opened without one.
func retryBusy(ctx context.Context, begin func() error) error {
	deadline := time.Now().Add(busyWait)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := begin()
		var se *sqlite.Error
		if err == nil || !errors.As(err, &se) || se.Code()&0xff != sqliteBusy || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// sqliteBusy is SQLITE_BUSY, the primary result code of a locked database.
const sqliteBusy = 5

// discard makes database/sql drop conn instead of pooling it.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}
