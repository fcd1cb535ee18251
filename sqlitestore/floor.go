package sqlitestore

import (
	"context"
	"database/sql"
	"log/slog"
	"time"
)

// The sequence floor (docs/restore.md). A log restored from a
// backup, or rebuilt, would hand out again the sequences its lost history
// had issued after the backup, for other events: a client resuming with
// one of them would be served a history that is not the one it read. So
// every time a log is opened (here: when its store is made), in one write
// transaction, the head is raised to the clock in Unix microseconds, F, if
// it is below it, and the range skipped is recorded: sequences strictly
// between the old head and F are never issued by this log. A copy of the
// log, restored later, is opened later, at a later F: the sequences the
// lost history issued after the backup (below the original's clock, as
// long as it issued fewer than one a microsecond on average since it was
// opened) fall inside the copy's skipped range, where a cursor is foreign:
// the client gets an unknown_cursor gap and goes on from the head, as for
// a cursor above the head. A cursor at or below the backup's head is
// served as usual: the two histories agree there. F itself becomes the
// head, which a fresh client may be handed as its cursor: it stays valid,
// as does 0 ("from the beginning").

// foreignSQL is true when the cursor c is foreign to a log whose head is
// h: above the head, or strictly inside a recorded skipped range. Skipped
// ranges never overlap and each ends at or below the head, so only the
// range starting nearest below c can hold it: one index probe. A range
// ending above the head is ignored: the log was reset under it from
// outside, and the range no longer describes it.
const foreignSQL = `(c > h OR coalesce((SELECT through FROM events_skips WHERE after < c ORDER BY after DESC LIMIT 1), 0) BETWEEN c + 1 AND h)`

const (
	qSkip = `INSERT INTO events_skips (after, through) VALUES (?1, ?2)
		ON CONFLICT (after) DO UPDATE SET through = max(through, excluded.through)`
	qSetHead    = `UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'events'`
	qInsertHead = `INSERT INTO sqlite_sequence (name, seq) VALUES ('events', ?1)`
)

// raiseFloor raises the head to now (Unix microseconds) if it is below,
// recording the skipped range, in one write transaction under writeMu:
// AUTOINCREMENT then gives the next row now+1. It returns the head before
// and after. A clock at or behind the head raises nothing; one behind it is
// logged, if logger is not nil: a backup restored later may then reuse
// sequences.
func (s *Store) raiseFloor(ctx context.Context, now int64, logger *slog.Logger) (before, after int64, err error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	err = s.writeTx(ctx, func(conn *sql.Conn) error {
		if err := conn.QueryRowContext(ctx, qHead).Scan(&before); err != nil {
			return err
		}
		after = before
		if now <= before {
			return nil
		}
		after = now
		return skipTo(ctx, conn, before, now)
	})
	if err == nil && now < before && logger != nil {
		logger.Warn("replayd: the clock is behind the log's head: the sequence floor was not raised, so a backup of this log restored later may reuse sequences (docs/restore.md)",
			"head", before, "clockMicros", now)
	}
	if err == nil {
		s.saw(after)
	}
	return before, after, err
}

// execer is what *sql.Conn and *sql.Tx offer for writes.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// skipTo raises the head from head to to (> head), recording the skipped
// range, inside the caller's write transaction on c.
func skipTo(ctx context.Context, c execer, head, to int64) error {
	if _, err := c.ExecContext(ctx, qSkip, head, to); err != nil {
		return err
	}
	res, err := c.ExecContext(ctx, qSetHead, to)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 { // no row was ever inserted: no sqlite_sequence row yet
		if _, err := c.ExecContext(ctx, qInsertHead, to); err != nil {
			return err
		}
	}
	return nil
}

// A log replaced under a running store. The floor is raised when a log is
// opened; a log whose file is overwritten in place while stores have it
// open (a restore through SQLite's online-backup API, as sqlite3's
// ".restore" does, or rows copied back from a backup) is not opened again,
// and its head is the backup's: below sequences its lost history issued,
// which clients hold. So the store remembers the highest sequence it knows
// its log issued (issued: its own appends, every head it read), and every
// write transaction that appends, once it finds the file written by
// another connection since its last look, reads the head: a head below
// issued can only be a log replaced (the head never goes backwards
// otherwise). It then raises the floor in that same transaction, before
// its rows take sequences: to the clock, as an open would, or just above
// issued if the clock is behind it. The lost history's sequences fall
// inside the range skipped, where cursors are foreign, and no sequence is
// issued twice: those other processes issued too, as long as they are
// below the clock. A store that saw nothing of the lost history (it
// neither appended nor read since the backup's head) cannot tell
// (docs/restore.md).

// saw records that the log issued seq (an append's, or a head read).
func (s *Store) saw(seq int64) {
	for {
		cur := s.issued.Load()
		if seq <= cur || s.issued.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// guardHead, inside a write transaction on c about to append, raises the
// floor if head, the log's head as the transaction reads it, is below a
// sequence the store knows was issued (see above). It returns the head
// the transaction's rows go above.
func (s *Store) guardHead(ctx context.Context, c execer, head int64) (int64, error) {
	issued := s.issued.Load()
	if head >= issued {
		return head, nil
	}
	to := max(floorClock(), issued+1) // issued itself strictly inside the range
	if err := skipTo(ctx, c, head, to); err != nil {
		return head, err
	}
	if s.logger != nil {
		s.logger.Warn("replayd: the log's head is below a sequence this store knows was issued: the log was replaced under it (restored in place from a backup?); raising the head so that no sequence is issued twice, and cursors of the lost history get unknown_cursor (docs/restore.md)",
			"head", head, "issued", issued, "raisedTo", to)
	}
	return to, nil
}

// floorClock is the sequence floor's clock: Unix microseconds.
func floorClock() int64 { return time.Now().UnixMicro() }
