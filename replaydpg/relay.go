package replaydpg

// Every Store runs a relay (started by Open, stopped by Close). At Open,
// on a watched transaction's commit, and every relaySweep (one small read
// when the outbox is empty), it moves the outbox into the log, oldest
// first, in transactions of at most relayRows events (relayBytes of
// payload) that take the relay's advisory lock (one relay at a time per
// log, over all nodes), read the rows, and then, in one pipeline, delete
// them, append them as Append does (under the head row's lock, with
// Append's idempotency by event id, ordinals and NOTIFY of the log's
// channel, which wakes every node's tail), and commit. Rows are deleted in
// the transaction that appends them, so a crash of anything anywhere
// relays each committed row exactly once: a node that dies mid-relay
// leaves its transaction to roll back, and another node's relay (or its
// own after a restart) moves the rows.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd/storage"
)

const (
	// qTxStatus: the status of each transaction id of $1 ('in progress',
	// 'committed', 'aborted', or NULL once the server forgot it), and
	// whether a snapshot taken now sees it ended: the commit log records a
	// commit a moment before the transaction's rows become visible, and a
	// relay woken by the first would not find them.
	qTxStatus = `SELECT x, pg_xact_status(x::xid8), pg_visible_in_snapshot(x::xid8, pg_current_snapshot())
		FROM unnest($1::text[]) AS t(x)`

	qOutboxAny = `SELECT EXISTS (SELECT 1 FROM %[1]soutbox)`

	// qOutboxTake: the oldest $1 rows of the outbox, cut once they hold $2
	// bytes of payload (at least one row).
	qOutboxTake = `SELECT o.id, o.event_id, o.type, o.topic, o.payload FROM (
		SELECT o.*, sum(octet_length(o.payload)) OVER (ORDER BY o.id ROWS UNBOUNDED PRECEDING) - octet_length(o.payload) AS before
		FROM (SELECT * FROM %[1]soutbox ORDER BY id LIMIT $1) o
	) o WHERE o.before < $2 ORDER BY o.id`

	qOutboxDelete = `DELETE FROM %[1]soutbox WHERE id = ANY($1::bigint[])`

	qRelayLock = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
)

const (
	relayRows     = 256                    // events per relay transaction, at most
	relayBytes    = 4 << 20                // and payload bytes (at least one event)
	relaySweep    = 1 * time.Second        // the relay looks at the outbox at least this often
	relayWatchMin = 1 * time.Millisecond   // the first look at a watched transaction's status
	relayWatchMax = 100 * time.Millisecond // and the longest interval between two
)

// watch hands the relay the id of a transaction that published.
func (s *Store) watch(xid string) {
	s.watchMu.Lock()
	s.watching = append(s.watching, xid)
	s.watchMu.Unlock()
	select {
	case s.relayKick <- struct{}{}:
	default:
	}
}

// relay is the relay goroutine: it moves the outbox into the log at the
// start, when a watched transaction commits and every relaySweep, until
// Close. An error (the server down, a relay transaction that failed) is
// retried at the next commit or sweep; the rows stay in the outbox
// meanwhile.
func (s *Store) relay() {
	defer close(s.relayDone)
	sweep := time.NewTicker(relaySweep)
	defer sweep.Stop()
	look := time.NewTimer(time.Hour)
	look.Stop()
	defer look.Stop()
	var (
		watched = map[string]struct{}{} // transactions in progress, as last seen
		wait    time.Duration           // before the next look at their status
	)
	s.drainOutbox(true) // rows a process left behind
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.relayKick:
			s.watchMu.Lock()
			for _, x := range s.watching {
				watched[x] = struct{}{}
			}
			s.watching = s.watching[:0]
			s.watchMu.Unlock()
			wait = relayWatchMin
			look.Reset(wait)
		case <-look.C:
			committed, err := s.txStatus(watched)
			if committed {
				s.drainOutbox(false)
			}
			if len(watched) > 0 {
				if err == nil {
					wait = min(2*wait, relayWatchMax)
				} else {
					wait = relayWatchMax
				}
				look.Reset(wait)
			}
		case <-sweep.C:
			s.drainOutbox(true)
		}
	}
}

// txStatus asks the server the status of the watched transactions,
// forgets those that ended, and reports whether one committed.
func (s *Store) txStatus(watched map[string]struct{}) (committed bool, err error) {
	xids := make([]string, 0, len(watched))
	for x := range watched {
		xids = append(xids, x)
	}
	rows, err := s.pool.Query(s.ctx, s.q.txStatus, xids)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			x       string
			status  *string
			visible bool
		)
		if err := rows.Scan(&x, &status, &visible); err != nil {
			return committed, err
		}
		switch {
		case status == nil || *status == "aborted":
			delete(watched, x)
		case *status == "committed" && visible:
			delete(watched, x)
			committed = true
		}
	}
	return committed, rows.Err()
}

// drainOutbox relays until the outbox is empty, as far as it can tell, or
// a relay fails. With peek, it first checks with one small read that the
// outbox holds anything (the idle sweep's only cost).
func (s *Store) drainOutbox(peek bool) {
	if peek {
		var found bool
		if err := s.pool.QueryRow(s.ctx, s.q.outboxAny).Scan(&found); err != nil || !found {
			return
		}
	}
	for s.ctx.Err() == nil {
		more, err := s.relayOnce(s.ctx)
		if err != nil || !more {
			return
		}
	}
}

// relayOnce moves the oldest rows of the outbox into the log in one
// transaction (see the top of this file). more reports that it moved a
// full transaction's worth, so more may be waiting.
func (s *Store) relayOnce(ctx context.Context) (more bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// A transaction left open by an error makes Release close the
	// connection: the server rolls it back.
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(qRelayLock, "replayd relay "+s.prefix)
	b.Queue(s.q.outboxTake, relayRows, relayBytes)
	var (
		ids   []int64
		evs   []storage.Event
		bytes int
	)
	br := conn.SendBatch(ctx, b)
	err = func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		if _, err := br.Exec(); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				id      int64
				ev      storage.Event
				topic   *string
				payload string
			)
			if err := rows.Scan(&id, &ev.EventID, &ev.Type, &topic, &payload); err != nil {
				return err
			}
			if topic != nil {
				ev.Topic = *topic
			}
			ev.Payload = []byte(payload)
			ids, evs, bytes = append(ids, id), append(evs, ev), bytes+len(payload)
		}
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("replaydpg: relay: %w", err)
	}
	if len(ids) == 0 {
		_, err := conn.Exec(ctx, "COMMIT")
		return false, err
	}
	rs := relaySend{conn: conn, del: s.q.outboxDelete, ids: ids}
	res, err := s.appendVia(ctx, evs, rs.send)
	if err != nil {
		return false, fmt.Errorf("replaydpg: relay: %w", err)
	}
	for _, r := range res {
		if r.Err != nil {
			// Text the outbox's columns held cannot be refused: nothing
			// reaches here. Were it to, the row is gone with the others.
			return false, fmt.Errorf("replaydpg: relay: event %q: %w", r.Event.EventID, r.Err)
		}
	}
	return len(ids) == relayRows || bytes >= relayBytes, nil
}

// relaySend is the relay's sender: it sends an append's pipeline in the
// relay's open transaction, after a savepoint and the outbox rows' delete,
// followed by the COMMIT, so that the head row's lock is held for one
// round trip, as in Append. Append sends a second pipeline after one
// that failed on an event id already stored: before it, the transaction
// rolls back to the savepoint (the relay's advisory lock and the rows it
// read stay held).
type relaySend struct {
	conn  *pgxpool.Conn
	del   string
	ids   []int64
	tries int
}

func (r *relaySend) send(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	rb := &pgx.Batch{}
	if r.tries > 0 {
		// Before the pipeline, which pgx may precede with a round trip
		// preparing its statements: an aborted transaction refuses that.
		if _, err := r.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT relay"); err != nil {
			return err
		}
	}
	r.tries++
	rb.Queue("SAVEPOINT relay")
	rb.Queue(r.del, r.ids)
	rb.QueuedQueries = append(rb.QueuedQueries, b.QueuedQueries...)
	rb.Queue("COMMIT")
	return readBatch(r.conn.SendBatch(ctx, rb), 2, read) // SAVEPOINT, the delete
}
