package replaydpg

// The append path: Append's statements, Append itself (appendVia, which
// the relay shares), and how an append's error tells whether it may have
// committed (appendOutcome; the package doc, "Unknown outcomes").

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/replayd/replayd/storage"
)

// Append, sent as one pipeline (one round trip, one implicit transaction).
//
// qLock takes the head row's lock first, in a statement of its own, so that
// the append statement's snapshot (qAppendNew's, qAppendDedup's), taken
// when it starts, already sees every append that committed before ours: in
// READ COMMITTED a statement's snapshot predates any lock wait inside it,
// so a single statement that both waits for the lock and reads the table
// (for duplicates, for the previous ordinals) would read stale rows. The lock is released at commit, after the commit
// is visible, so commit order, visibility order and sequence order agree.
//
// Append first sends qAppendNew, which takes every event for new; if one of
// the event ids is already stored, its INSERT fails on the unique
// constraint, the whole transaction rolls back (the head with it), and
// Append sends the batch again with qAppendDedup, which looks each id up
// and stores only the new ones. Retried publishes are rare; looking up every
// id, numbering the survivors with window functions and returning a row
// per event cost about half of a 64-event batch on the server
// (git show 60f0bd1:BENCHMARKS.md, "Issue 11: PostgreSQL").
const (
	qLock = `SELECT 1 FROM %[1]shead WHERE id = 1 FOR UPDATE`

	// topicBases is the CTE tb of the append statements: for each topic d
	// of the batch, the topic ordinal of its newest row (0 if none), by an
	// index probe each.
	topicBases = `tb AS MATERIALIZED (
		SELECT coalesce(d.topic, '') AS topic, coalesce(CASE WHEN d.topic IS NULL
			THEN (SELECT e.topic_ord FROM %[1]sevents e WHERE e.topic IS NULL ORDER BY e.topic DESC, e.sequence DESC LIMIT 1)
			ELSE (SELECT e.topic_ord FROM %[1]sevents e WHERE (e.topic, e.sequence) > (d.topic, 0) AND (e.topic, e.sequence) <= (d.topic, 9223372036854775807)
				ORDER BY e.topic DESC, e.sequence DESC LIMIT 1)
		END, 0) AS ord0`

	// floorGuard is the CTEs guard and guard_skip of the append statements,
	// $6 the highest sequence the store knows its log issued
	// (Store.issued). A head below it can only be a log replaced under the
	// store (its tables restored in place, with pg_restore --data-only,
	// say): the head never goes backwards otherwise. guard is then one row:
	// the head, and the floor it is raised to, the server's clock in Unix
	// microseconds or $6+1 if the clock is behind it; guard_skip records the
	// range skipped, and the statement's rows go above the floor. The lost
	// history's sequences fall inside the range, where cursors are foreign,
	// and none is issued twice. The statement's snapshot sees the head as
	// qLock locked it. When nothing was replaced it costs one index probe
	// of the one-row head table.
	floorGuard = `guard AS (
		SELECT h0.seq AS old, greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, $6::bigint + 1) AS floor
		FROM %[1]shead h0 WHERE h0.id = 1 AND h0.seq < $6::bigint
	), guard_skip AS (
		INSERT INTO %[1]sskips (after, through) SELECT guard.old, guard.floor FROM guard
		ON CONFLICT (after) DO UPDATE SET through = greatest(%[1]sskips.through, excluded.through)
	)`

	// $1..$4: event ids (distinct: Append drops repeats within the batch),
	// types, topics (NULL: broadcast), payloads; $5 the NOTIFY channel
	// (empty: none); $6 see floorGuard; $7 each event's rank, from 1,
	// among the batch's events of its topic (broadcasts are a topic of
	// their own). Every event is stored: the i-th (from 1) gets sequence
	// seq0+i and global ordinal ord0+i, and the topic ordinal after its
	// topic's newest row's plus its rank. It returns one row: seq0 and the
	// batch's created_at.
	qAppendNew = `WITH ` + floorGuard + `, h AS (
		UPDATE %[1]shead SET seq = coalesce((SELECT guard.floor FROM guard), seq) + cardinality($1::text[]), ord = ord + cardinality($1::text[]),
			created_at = greatest(created_at, clock_timestamp())
		WHERE id = 1
		RETURNING seq - cardinality($1::text[]) AS seq0, ord - cardinality($1::text[]) AS ord0, created_at
	), ` + topicBases + `
		FROM (SELECT DISTINCT topic FROM unnest($3::text[]) AS t(topic)) d
	), ins AS (
		INSERT INTO %[1]sevents (sequence, event_id, type, topic, payload, created_at, topic_ord, global_ord)
		SELECT h.seq0 + u.i, u.event_id, u.type, u.topic, u.payload, h.created_at, tb.ord0 + u.t, h.ord0 + u.i
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $7::bigint[]) WITH ORDINALITY AS u(event_id, type, topic, payload, t, i)
		CROSS JOIN h JOIN tb ON tb.topic = coalesce(u.topic, '')
	)
	SELECT h.seq0, h.created_at,
		CASE WHEN $5::text <> '' THEN pg_notify($5, (h.seq0 + cardinality($1::text[]))::text) END IS NULL
	FROM h`

	// $1..$4: event ids (distinct: Append drops repeats within the batch),
	// types, topics (NULL: broadcast), payloads; $5 the NOTIFY channel
	// (empty: none), notified once with the new head if anything was
	// stored, delivered at commit; $6 see floorGuard. Rows whose event id
	// is stored are duplicates: they take no sequence and return the stored
	// original; a new row returns only its sequence and created_at.
	// Every lookup is an index probe per row or per topic (a scalar
	// subquery, a MATERIALIZED CTE, a LATERAL with LIMIT), whatever the
	// table's size: a hash join would scan the whole log, and a lookup
	// inlined into the insert's join would run once per inserted row, each
	// walking back over the rows this statement already inserted.
	qAppendDedup = `WITH ` + floorGuard + `, b AS MATERIALIZED (
		SELECT u.i, u.event_id, u.type, u.topic, u.payload,
			(SELECT e.sequence FROM %[1]sevents e WHERE e.event_id = u.event_id) AS stored
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(event_id, type, topic, payload, i)
	), numbered AS (
		SELECT b.*, row_number() OVER (ORDER BY b.i) AS g, row_number() OVER (PARTITION BY b.topic ORDER BY b.i) AS t
		FROM b WHERE b.stored IS NULL
	), c AS (
		SELECT count(*) AS n FROM numbered
	), h AS (
		UPDATE %[1]shead SET seq = coalesce((SELECT guard.floor FROM guard), %[1]shead.seq) + c.n, ord = %[1]shead.ord + c.n,
			created_at = greatest(%[1]shead.created_at, clock_timestamp())
		FROM c WHERE %[1]shead.id = 1
		RETURNING %[1]shead.seq - c.n AS seq0, %[1]shead.ord - c.n AS ord0, %[1]shead.created_at
	), ` + topicBases + `
		FROM (SELECT DISTINCT topic FROM numbered) d
	), ins AS (
		INSERT INTO %[1]sevents (sequence, event_id, type, topic, payload, created_at, topic_ord, global_ord)
		SELECT h.seq0 + n.g, n.event_id, n.type, n.topic, n.payload, h.created_at, tb.ord0 + n.t, h.ord0 + n.g
		FROM numbered n CROSS JOIN h JOIN tb ON tb.topic = coalesce(n.topic, '')
		RETURNING sequence, event_id, created_at
	), nt AS (
		SELECT pg_notify($5, (h.seq0 + c.n)::text) FROM h, c WHERE c.n > 0 AND $5::text <> ''
	)
	SELECT b.stored IS NOT NULL, coalesce(ins.sequence, e.sequence), coalesce(ins.created_at, e.created_at),
		e.event_id, e.type, e.topic, e.payload
	FROM b
	LEFT JOIN ins ON ins.event_id = b.event_id
	LEFT JOIN LATERAL (
		SELECT ` + eventColumns + ` FROM %[1]sevents e WHERE e.sequence = b.stored LIMIT 1
	) e ON true
	CROSS JOIN (SELECT count(*) FROM nt) notified
	ORDER BY b.i`
)

// AppendResult is the outcome of one event of an Append batch: see
// replayd.AppendResult.
type AppendResult = storage.AppendResult

// Append stores evs in order, in one transaction and one round trip (two
// when an event id is stored already: see the statements above), and
// returns one result per event, in the same order. Each stored event gets the next sequence,
// above every sequence ever assigned, and created_at from the server
// clock, never below the previous batch's. Sequence, CreatedAt and Topic
// of evs are ignored except Topic ("" is a broadcast).
//
// On return without error the batch is committed (durable as far as the
// server's synchronous_commit makes it) and visible to every reader, and
// every listener has been notified once. With an error, nothing of the
// batch is stored, unless the error wraps replayd.ErrOutcomeUnknown: then
// the whole batch may be stored, or may still be (see the package doc,
// "Unknown outcomes"), and appending it again with the same event ids
// returns the stored originals as duplicates.
//
// Concurrent Appends, from this process or others, are serialised on the
// head row's lock for the time the server takes to insert and commit; the
// lock is never held across a round trip to the client.
func (s *Store) Append(ctx context.Context, evs []storage.Event) ([]AppendResult, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	return s.appendVia(ctx, evs, s.sendAppend)
}

// sender sends an append's pipeline b and reads its results with read
// (sendAppend; the relay's sends it inside its own transaction).
type sender func(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error

// appendVia is Append, its pipelines sent by send, which commits them.
func (s *Store) appendVia(ctx context.Context, evs []storage.Event, send sender) ([]AppendResult, error) {
	res, err := s.appendRows(ctx, evs, send)
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		if r.Err == nil {
			s.saw(r.Event.Sequence)
		}
	}
	return res, nil
}

// appendRows is appendVia without raising s.issued: for a sender whose
// transaction may still roll back (a stream transaction's, streams.go),
// whose caller raises it once the transaction committed. An issued above
// a head that never reached it would read as a log replaced under the
// store (floorGuard).
func (s *Store) appendRows(ctx context.Context, evs []storage.Event, send sender) ([]AppendResult, error) {
	res := make([]AppendResult, len(evs))
	var (
		idx                  []int // res index of each row sent
		ids, types, payloads []string
		topics               []*string
		ranks                []int64                          // each row's rank among the batch's rows of its topic
		counts               = map[string]int64{}             // topic → rows of it so far
		first                = make(map[string]int, len(evs)) // event id → res index of its first valid occurrence
		repeats              []int                            // res indexes of later occurrences
	)
	for i, ev := range evs {
		res[i].Event = ev
		if err := checkText(ev); err != nil {
			res[i].Err = err
			continue
		}
		if _, ok := first[ev.EventID]; ok {
			repeats = append(repeats, i)
			continue
		}
		first[ev.EventID] = i
		idx = append(idx, i)
		ids = append(ids, ev.EventID)
		types = append(types, ev.Type)
		payloads = append(payloads, string(ev.Payload))
		var topic *string
		if ev.Topic != "" {
			topic = &evs[i].Topic
		}
		topics = append(topics, topic)
		counts[ev.Topic]++
		ranks = append(ranks, counts[ev.Topic])
	}
	if len(idx) == 0 {
		return res, nil
	}
	channel := s.channel
	if s.noNotify {
		channel = ""
	}
	var err error
	if !s.dedupAlways {
		err = s.appendNew(ctx, send, res, idx, ids, types, topics, payloads, ranks, channel)
	}
	if s.dedupAlways || s.isStoredID(err) {
		// An event id is stored already: nothing was, try again looking
		// each one up.
		err = s.appendDedup(ctx, send, res, idx, ids, types, topics, payloads, channel)
	}
	if err != nil {
		return nil, fmt.Errorf("replaydpg: append: %w", err)
	}
	for _, i := range repeats {
		res[i].Event, res[i].Duplicate = res[first[evs[i].EventID]].Event, true
	}
	return res, nil
}

// isStoredID reports whether err is qAppendNew's failure on an event id
// that is already stored: a unique violation of the event id constraint.
func (s *Store) isStoredID(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == s.prefix+"events_event_id_key"
}

// appendNew sends the rows as new (qAppendNew) and fills in res[idx[k]]'s
// sequence and created_at. It fails on an event id that is stored already
// (see isStoredID), having stored nothing.
func (s *Store) appendNew(ctx context.Context, send sender, res []AppendResult, idx []int, ids, types []string, topics []*string, payloads []string, ranks []int64, channel string) error {
	b := &pgx.Batch{}
	b.Queue(s.q.lock)
	b.Queue(s.q.appendNew, ids, types, topics, payloads, channel, s.issued.Load(), ranks)
	var (
		seq0      int64
		createdAt time.Time
		notified  bool
	)
	err := send(ctx, b, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		return br.QueryRow().Scan(&seq0, &createdAt, &notified)
	})
	if err != nil {
		return err
	}
	for k, i := range idx {
		res[i].Event.Sequence, res[i].Event.CreatedAt = seq0+int64(k)+1, createdAt
	}
	return nil
}

// appendDedup sends the rows with qAppendDedup, which stores only those
// whose event id is not stored yet, and fills in res[idx[k]]: the sequence
// and created_at of a stored row, the stored original of a duplicate.
func (s *Store) appendDedup(ctx context.Context, send sender, res []AppendResult, idx []int, ids, types []string, topics []*string, payloads []string, channel string) error {
	b := &pgx.Batch{}
	b.Queue(s.q.lock)
	b.Queue(s.q.appendDedup, ids, types, topics, payloads, channel, s.issued.Load())
	return send(ctx, b, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			if n == len(idx) {
				return errors.New("more rows than events")
			}
			r := &res[idx[n]]
			var (
				stored                  storage.Event
				id, typ, topic, payload *string
			)
			if err := rows.Scan(&r.Duplicate, &stored.Sequence, &stored.CreatedAt, &id, &typ, &topic, &payload); err != nil {
				return err
			}
			if r.Duplicate {
				if id == nil || typ == nil || payload == nil {
					return fmt.Errorf("duplicate of event id %q vanished", r.Event.EventID)
				}
				stored.EventID, stored.Type, stored.Payload = *id, *typ, []byte(*payload)
				if topic != nil {
					stored.Topic = *topic
				}
				r.Event = stored
			} else {
				r.Event.Sequence, r.Event.CreatedAt = stored.Sequence, stored.CreatedAt
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != len(idx) {
			return fmt.Errorf("%d rows for %d events", n, len(idx))
		}
		return nil
	})
}

// sendAppend sends b, an append's pipeline (one implicit transaction,
// committed when the server reaches its end), on a connection of the
// pool, reads its results with read, and reads the commit's answer. An
// error that does not prove the batch uncommitted wraps
// replayd.ErrOutcomeUnknown (see appendOutcome).
func (s *Store) sendAppend(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err // nothing was sent
	}
	defer conn.Release()
	br := conn.SendBatch(ctx, b)
	err = read(br)
	// Close reads the commit's answer: only after it is the batch stored.
	cerr := br.Close()
	if err == nil {
		err = cerr
	}
	return appendOutcome(err, cerr)
}

// appendOutcome returns err, the first error of an append's pipeline
// (cerr: the error reading the pipeline's end), wrapped with
// replayd.ErrOutcomeUnknown unless it proves that the transaction did not
// commit. Two kinds of error prove it:
//   - one pgconn marks safe to retry (pgconn.SafeToRetry): it happened
//     before any byte of the pipeline was written (the connection was busy,
//     ctx was done, a write that wrote nothing);
//   - an error the server reported with severity ERROR, for this pipeline
//     or at its end: the server aborts the implicit transaction and skips
//     the rest of the pipeline (a lock_timeout, a unique violation, a
//     statement cancelled by ctx through pgx's cancel request).
//
// Anything else may come after the server committed or while it still
// may: a connection that broke or a ctx that ended after the pipeline was
// written (pgx then closes the connection; its cancel request may land
// after the commit, or never), a FATAL error (a terminated session may
// have committed first), or a client-side error reading an answer of a
// pipeline that then committed.
func appendOutcome(err, cerr error) error {
	if err == nil || pgconn.SafeToRetry(err) || serverRefused(err) || serverRefused(cerr) {
		return err
	}
	return fmt.Errorf("%w: %w", storage.ErrOutcomeUnknown, err)
}

// serverRefused reports whether err is an error the server reported with
// severity ERROR: the statement failed and its transaction is aborted.
// FATAL and PANIC end the session, and need not abort what it committed.
func serverRefused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	sev := pe.SeverityUnlocalized // PostgreSQL 9.6 and later
	if sev == "" {
		sev = pe.Severity
	}
	return sev == "ERROR"
}

// checkText refuses what a PostgreSQL text column would: invalid UTF-8 and
// NUL, in any of the event's strings.
func checkText(ev storage.Event) error {
	for _, f := range []struct{ name, v string }{
		{"payload", string(ev.Payload)}, {"event id", ev.EventID}, {"type", ev.Type}, {"topic", ev.Topic},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("replaydpg: %w: %s is not valid UTF-8", storage.ErrInvalid, f.name)
		}
		for i := 0; i < len(f.v); i++ {
			if f.v[i] == 0 {
				return fmt.Errorf("replaydpg: %w: %s holds NUL", storage.ErrInvalid, f.name)
			}
		}
	}
	return nil
}
