package replaydpg

// Readiness (storage.WriteProber): ProbeWrite, and the statement that lets
// the server give up on the head row's lock on its own (the package doc,
// "Readiness").

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// qProbe is the first statement of ProbeWrite's pipeline (one implicit
// transaction, qLock after it). For that transaction only, it sets $1 as
// lock_timeout, and synchronous_commit off: the transaction writes nothing,
// it only holds the head row's lock until its commit, which then need not
// wait for a WAL flush. Its third column tells whether the server accepts
// writes.
const qProbe = `SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true),
	NOT pg_is_in_recovery() AND current_setting('default_transaction_read_only') = 'off'`

// ProbeWrite reports whether a publish could get through now, writing
// nothing (EventHub.Ready calls it): the pool's server accepts writes (it
// is not a hot standby, and not read-only by default), and the head row's
// lock, which every Append takes first, can be had. It takes that lock the
// way an Append does, queued behind the appends already waiting, and
// releases it at once, in one round trip: a transaction that sets a
// lock_timeout, runs Append's own "SELECT … FOR UPDATE" on the head row,
// and commits without waiting for a WAL flush, so the lock is held for
// microseconds and publishes queued behind the probe barely notice. The
// server waits for the lock as long as ctx leaves, less a margin for the
// answer (probeWait; 2 s without a deadline), and then gives up on its
// own, so a failed probe leaves no session queued on the lock. NOWAIT
// would answer another question (is the lock free this instant?), which
// under a steady publish load is often no while every publish gets through
// within milliseconds: it would fail healthy nodes. One probe runs at a
// time per store; another waits for it, within its ctx.
func (s *Store) ProbeWrite(ctx context.Context) error {
	if s.isClosed() {
		return ErrClosed
	}
	select {
	case s.probe <- struct{}{}:
		defer func() { <-s.probe }()
	case <-ctx.Done():
		return fmt.Errorf("replaydpg: probe write: %w (waiting for another probe)", ctx.Err())
	}
	wait := probeWait(ctx)
	b := &pgx.Batch{}
	b.Queue(qProbe, strconv.FormatInt(wait.Milliseconds(), 10)+"ms")
	b.Queue(s.q.lock)
	br := s.pool.SendBatch(ctx, b)
	var writable bool
	err := br.QueryRow().Scan(nil, nil, &writable)
	var lerr error
	if err == nil {
		_, lerr = br.Exec()
	}
	cerr := br.Close()
	var pe *pgconn.PgError
	switch {
	case err != nil:
		return fmt.Errorf("replaydpg: probe write: %w", err)
	case !writable:
		return errors.New("replaydpg: probe write: the server is read-only (a standby, or default_transaction_read_only)")
	case errors.As(lerr, &pe) && pe.Code == "55P03":
		return fmt.Errorf("replaydpg: probe write: the head row's lock was not free within %v, so no publish can get through (another transaction holds it: see pg_locks): %w", wait, lerr)
	case lerr != nil:
		return fmt.Errorf("replaydpg: probe write: %w", lerr)
	case cerr != nil:
		return fmt.Errorf("replaydpg: probe write: %w", cerr)
	}
	return nil
}

// probeWait is how long ProbeWrite lets the server wait for the head
// row's lock: what ctx leaves, less a fifth of it (at most 100 ms) for the
// answer to come back before ctx ends; at least 1 ms (0 would be no
// timeout); 2 s when ctx has no deadline.
func probeWait(ctx context.Context) time.Duration {
	d, ok := ctx.Deadline()
	if !ok {
		return 2 * time.Second
	}
	left := time.Until(d)
	return max(left-min(left/5, 100*time.Millisecond), time.Millisecond).Truncate(time.Millisecond)
}
