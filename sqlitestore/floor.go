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
func (l *Store) raiseFloor(ctx context.Context, now int64, logger *slog.Logger) (before, after int64, err error) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	err = l.writeTx(ctx, func(conn *sql.Conn) error {
		if err := conn.QueryRowContext(ctx, qHead).Scan(&before); err != nil {
			return err
		}
		after = before
		if now <= before {
			return nil
		}
		if _, err := conn.ExecContext(ctx, qSkip, before, now); err != nil {
			return err
		}
		res, err := conn.ExecContext(ctx, qSetHead, now)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 { // no row was ever inserted: no sqlite_sequence row yet
			if _, err := conn.ExecContext(ctx, qInsertHead, now); err != nil {
				return err
			}
		}
		after = now
		return nil
	})
	if err == nil && now < before && logger != nil {
		logger.Warn("replayd: the clock is behind the log's head: the sequence floor was not raised, so a backup of this log restored later may reuse sequences (docs/restore.md)",
			"head", before, "clockMicros", now)
	}
	return before, after, err
}

// floorClock is the sequence floor's clock: Unix microseconds.
func floorClock() int64 { return time.Now().UnixMicro() }
