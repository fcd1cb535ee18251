package replaydpg

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/replayd/replayd/storage"
)

// Store keeps replayd's storage contract (the storetest kit checks it) and
// wakes a tailing hub through LISTEN/NOTIFY.
var (
	_ storage.Store         = (*Store)(nil)
	_ storage.Notifier      = (*Store)(nil)
	_ storage.SchemaEnsurer = (*Store)(nil)
	_ storage.WriteProber   = (*Store)(nil)
)

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

// Read reads, in one REPEATABLE READ READ ONLY transaction (one round
// trip), the oldest events of the scope above req.After, at most req.Limit
// (<= 0: 100) and up to req.Through (0: no bound), stopping once they hold
// req.MaxBytes of payload (at least one), with More, the head and the
// scope's watermark (see replayd.Store.Read). With a MaxBytes the page is
// cut on the server (qPageGlobal): no payload it leaves out is read or
// sent. Without one, it reads limit+1 events (the last tells More) with
// the plain oldest read, which costs less than the page statement's
// window.
func (s *Store) Read(ctx context.Context, req storage.ReadRequest) (p storage.Page, err error) {
	if s.isClosed() {
		return p, ErrClosed
	}
	topics, err := scopeTopics(req.Scope)
	if err != nil {
		return p, err
	}
	// One row more than the limit tells More: the limit stays below the
	// largest bigint.
	limit := int64(min(defaultLimit(req.Limit), math.MaxInt-1))
	through := req.Through
	if through <= 0 {
		through = math.MaxInt64
	}
	paged := req.MaxBytes > 0
	var query string
	args := []any{}
	if len(topics) > 0 {
		args = append(args, topics)
	}
	switch {
	case paged && len(topics) > 0:
		query, args = s.q.pageTopics, append(args, req.After, through, limit, req.MaxBytes)
	case paged:
		query, args = s.q.pageGlobal, append(args, req.After, through, limit, req.MaxBytes)
	case len(topics) > 0:
		query, args = s.q.oldestTopics, append(args, req.After, limit+1)
	default:
		query, args = s.q.oldestGlobal, append(args, req.After, limit+1)
	}
	err = s.scopeSnapshot(ctx, topics, req.After, &p.Head, &p.Foreign, &p.Watermark, func(b *pgx.Batch) {
		b.Queue(query, args...)
	}, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				ev      storage.Event
				topic   *string
				payload *string
				keep    = true
			)
			dest := []any{&ev.Sequence, &ev.EventID, &ev.Type, &topic, &payload, &ev.CreatedAt}
			if paged {
				dest = append(dest, &keep)
			}
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			if !paged && ev.Sequence > through {
				break
			}
			if !keep || int64(len(p.Events)) == limit {
				p.More = true
				break
			}
			if payload == nil {
				return fmt.Errorf("event %d came without its payload", ev.Sequence)
			}
			if topic != nil {
				ev.Topic = *topic
			}
			ev.Payload = []byte(*payload)
			p.Events = append(p.Events, ev)
		}
		return rows.Err()
	})
	if err != nil {
		return storage.Page{}, fmt.Errorf("replaydpg: read: %w", err)
	}
	return p, nil
}

// Window reads a resuming client's window (see replayd.Store.Window) in
// one REPEATABLE READ READ ONLY transaction (one round trip): the head, the
// watermark, the sequences of the newest limit+1 events of the scope above
// the cursor (one limited index scan per topic, no payload) and the count
// above the cursor (two index probes per topic), wherever the cursor is.
func (s *Store) Window(ctx context.Context, scope []string, cursor int64, limit int) (w storage.Window, err error) {
	if s.isClosed() {
		return w, ErrClosed
	}
	topics, err := scopeTopics(scope)
	if err != nil {
		return w, err
	}
	cursor, limit = max(cursor, 0), max(limit, 0)
	newest, count, args := s.q.newestSeqGlobal, s.q.countGlobal, []any{}
	if len(topics) > 0 {
		newest, count, args = s.q.newestSeqTopics, s.q.countTopics, []any{topics}
	}
	var (
		seqs       []int64
		total, fst int64
	)
	err = s.scopeSnapshot(ctx, topics, cursor, &w.Head, &w.Foreign, &w.Watermark, func(b *pgx.Batch) {
		// One sequence more than the window: the newest skipped one.
		b.Queue(newest, append(args, cursor, limit+1)...)
		b.Queue(count, append(args, cursor)...)
	}, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		return br.QueryRow().Scan(&total, &fst)
	})
	if err != nil {
		return storage.Window{}, fmt.Errorf("replaydpg: window: %w", err)
	}
	if cursor >= w.Head || w.Foreign {
		return storage.Window{Head: w.Head, Foreign: w.Foreign}, nil
	}
	w.From = w.Head + 1
	if n := min(len(seqs), limit); n > 0 {
		w.From = seqs[n-1] // seqs are descending
	}
	if len(seqs) > limit {
		w.Skipped = storage.Span{Count: total - int64(limit), First: fst, Last: seqs[limit]}
	}
	return w, nil
}

// Count counts the scope's events in (after, before) in one snapshot: the
// events above after less those above before-1, each counted by ordinals
// (two index probes per topic).
func (s *Store) Count(ctx context.Context, scope []string, after, before int64) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if before <= after+1 {
		return 0, nil
	}
	topics, err := scopeTopics(scope)
	if err != nil {
		return 0, err
	}
	count, args := s.q.countGlobal, []any{}
	if len(topics) > 0 {
		count, args = s.q.countTopics, []any{topics}
	}
	b := &pgx.Batch{}
	b.Queue(qBeginSnapshot)
	b.Queue(count, append(args, after)...)
	b.Queue(count, append(args, before-1)...)
	b.Queue("COMMIT")
	var above, atOrAbove, first int64
	err = s.snapshot(ctx, b, func(br pgx.BatchResults) error {
		if err := br.QueryRow().Scan(&above, &first); err != nil {
			return err
		}
		return br.QueryRow().Scan(&atOrAbove, &first)
	})
	if err != nil {
		return 0, fmt.Errorf("replaydpg: count: %w", err)
	}
	return above - atOrAbove, nil
}
