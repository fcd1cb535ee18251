package replaydpg

// The sequence floor (docs/restore.md; the package doc, "Log identity"):
// raiseHead repairs a head row lost or lowered from outside and raises the
// head to the server's clock (at Open; at EnsureSchema only after a
// repair); under a running Store, every append's floorGuard (append.go)
// raises it above the highest sequence the Store knows was issued, which
// saw keeps.

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The head row and the sequence floor (Open; see raiseHead).
const (
	// qHeadRow locks the head row, waiting for appends in flight.
	qHeadRow = `SELECT seq FROM %[1]shead WHERE id = 1 FOR UPDATE`

	// qHighest: the highest sequence that exists or existed, as far as the
	// tables tell (rows, watermarks, skipped ranges), with the newest row's
	// global ordinal and created_at, and the server's clock in Unix
	// microseconds (the same on every node).
	qHighest = `SELECT greatest(
			coalesce((SELECT e.sequence FROM %[1]sevents e ORDER BY e.sequence DESC LIMIT 1), 0),
			coalesce((SELECT max(w.sequence) FROM %[1]swatermarks w), 0),
			coalesce((SELECT max(k.through) FROM %[1]sskips k), 0)),
		coalesce((SELECT e.global_ord FROM %[1]sevents e ORDER BY e.sequence DESC LIMIT 1), 0),
		coalesce((SELECT e.created_at FROM %[1]sevents e ORDER BY e.sequence DESC LIMIT 1), '-infinity'),
		(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`

	qInsertHead = `INSERT INTO %[1]shead (id, seq, ord, created_at) VALUES (1, $1, $2, $3)`
	qRepairHead = `UPDATE %[1]shead SET seq = $1, ord = greatest(ord, $2), created_at = greatest(created_at, $3) WHERE id = 1`
	qSkip       = `INSERT INTO %[1]sskips (after, through) VALUES ($1, $2)
		ON CONFLICT (after) DO UPDATE SET through = greatest(%[1]sskips.through, excluded.through)`
	qJump = `UPDATE %[1]shead SET seq = $1 WHERE id = 1`
)

// errHeadUnknown is raiseHead's refusal: the head row was missing or
// below the log, and the clock cannot put the head above every sequence
// the log may have issued.
var errHeadUnknown = errors.New("the head row was missing or below the highest sequence stored, and the server's clock (in microseconds) is not above it: cannot tell which sequences this log issued; set the clock right, or the head row (UPDATE <prefix>head SET seq = …) to a sequence above every one the log ever issued")

// raiseHead, in tx, under the head row's lock (or, if the row is missing,
// the schema's advisory lock, without which no append can commit): makes
// sure the head is at or above the highest sequence that exists or existed
// as far as the tables tell (rows, watermarks, skipped ranges), recreating
// or raising the head row from them if it was lost or lowered from
// outside; then, if floor is set, raises the sequence floor: the head to
// the server's clock in Unix microseconds, if it is below, recording the
// skipped range. A head row it recreated or raised is followed by a raise
// of the floor, floor set or not (the tables do not tell what was issued
// above their highest sequence); if the clock is not above the head, it
// refuses with errHeadUnknown.
func (s *Store) raiseHead(ctx context.Context, tx pgx.Tx, floor bool) error {
	var head int64
	err := tx.QueryRow(ctx, s.q.headRow).Scan(&head)
	missing := errors.Is(err, pgx.ErrNoRows)
	if err != nil && !missing {
		return err
	}
	var (
		highest, ord, now int64
		created           pgtype.Timestamptz
	)
	if err := tx.QueryRow(ctx, s.q.highest).Scan(&highest, &ord, &created, &now); err != nil {
		return err
	}
	repaired := missing || head < highest
	switch {
	case missing:
		if _, err := tx.Exec(ctx, s.q.insertHead, highest, ord, created); err != nil {
			return err
		}
		head = highest
	case head < highest:
		if _, err := tx.Exec(ctx, s.q.repairHead, highest, ord, created); err != nil {
			return err
		}
		head = highest
	}
	if !floor && !repaired {
		return nil
	}
	if now <= head {
		if repaired && head > 0 {
			return errHeadUnknown
		}
		return nil // the clock is behind: no floor this time
	}
	if _, err := tx.Exec(ctx, s.q.skip, head, now); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, s.q.jump, now)
	return err
}

// saw records that the log issued seq (an append's, or a head read).
func (s *Store) saw(seq int64) {
	for {
		cur := s.issued.Load()
		if seq <= cur || s.issued.CompareAndSwap(cur, seq) {
			return
		}
	}
}
