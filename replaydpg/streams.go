package replaydpg

// Durable Streams' state (storage.StreamStore): UpdateStreams and its
// transaction, ReadStream, and their statements.
//
// UpdateStreams runs fn in one READ COMMITTED transaction on one
// connection of the pool. Its first pipeline, BEGIN and one
// pg_advisory_xact_lock per topic, serialises it against every other
// UpdateStreams naming one of its topics, on any node: the keys are a
// 64-bit hash of the table prefix and the topic (streamLockKey), taken in
// ascending order of the key, once each, so two transactions never wait
// for each other in a cycle whatever their topics' order, and two hashes
// that collide only serialise more. Every statement of fn then sees what
// the previous holders committed (READ COMMITTED takes a snapshot per
// statement, after the lock).
//
// Its Append is Append's own path (appendRows): the head row's lock, the
// same statements, the same NOTIFY of the log's channel, delivered at the
// commit, which wakes every node's WaitForAppend and tail as any append
// does. The head row's lock is then held until the commit, so sequence
// order stays visibility order; to hold it for as few round trips as can
// be, the writes (PutStream, DeleteStream, PutProducer) are not sent on
// their own: they are queued and sent in front of the next statement, the
// last ones with the COMMIT. An Append of the Durable Streams handler is
// then its append's round trip and the commit's.
//
// fn is called again (at most streamRetries times) when the transaction
// fails with a serialisation failure or a deadlock the server detected
// (SQLSTATE 40001, 40P01), which abort it whole; the advisory locks make
// them unexpected, but a server may still report them.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd/storage"
)

var _ storage.StreamStore = (*Store)(nil)

// streamRetries is how many times UpdateStreams runs fn again after a
// serialisation failure or a deadlock.
const streamRetries = 5

// rollbackTimeout bounds the ROLLBACK of a stream transaction that failed;
// past it the connection is closed, which rolls it back too.
const rollbackTimeout = 5 * time.Second

const (
	qStreamLock = `SELECT pg_advisory_xact_lock($1::bigint)`

	qStreamGet  = `SELECT meta, expires_at FROM %[1]sstreams WHERE topic = $1`
	qStreamsGet = `SELECT topic, meta, expires_at FROM %[1]sstreams WHERE topic = ANY($1::text[])`
	qStreamPut  = `INSERT INTO %[1]sstreams (topic, meta, expires_at) VALUES ($1, $2, $3)
		ON CONFLICT (topic) DO UPDATE SET meta = excluded.meta, expires_at = excluded.expires_at`
	qStreamDelete = `WITH p AS (DELETE FROM %[1]sstream_producers WHERE topic = $1)
		DELETE FROM %[1]sstreams WHERE topic = $1`
	qProducerGet = `SELECT state FROM %[1]sstream_producers WHERE topic = $1 AND producer = $2`
	qProducerPut = `INSERT INTO %[1]sstream_producers (topic, producer, state) VALUES ($1, $2, $3)
		ON CONFLICT (topic, producer) DO UPDATE SET state = excluded.state`

	qStreamDue = `SELECT topic, meta, expires_at FROM %[1]sstreams
		WHERE expires_at > 0 AND expires_at <= $1 ORDER BY expires_at, topic LIMIT $2`

	// The topic's own watermark, newest event and whether an event of it
	// has sequence $2. The topic's rows are bounded by row comparisons, as
	// in query.go (see schema.go).
	qStreamWatermark = `SELECT coalesce((SELECT sequence FROM %[1]swatermarks WHERE topic = $1), 0)`
	qStreamLast      = `SELECT coalesce((SELECT e.sequence FROM %[1]sevents e
		WHERE (e.topic, e.sequence) > ($1::text, 0) AND (e.topic, e.sequence) <= ($1::text, 9223372036854775807)
		ORDER BY e.topic DESC, e.sequence DESC LIMIT 1), 0)`
	qStreamAt = `SELECT EXISTS (SELECT 1 FROM %[1]sevents e WHERE e.sequence = $2 AND e.topic = $1)`

	// qStreamPage is qPageTopics (query.go) for the one topic $1 and no
	// broadcasts: $2 after, $3 through, $4 limit, $5 maxBytes.
	qStreamPage = `SELECT p.sequence, p.event_id, p.type, p.topic, CASE WHEN p.keep THEN p.payload END, p.created_at, p.keep FROM (
		SELECT w.*, w.n <= $4::bigint AND (w.n = 1 OR w.before < $5::bigint) AS keep,
			w.n = 1 OR (w.n - 1 <= $4::bigint AND (w.n = 2 OR w.before - w.prev < $5::bigint)) AS shown
		FROM (SELECT c.*, row_number() OVER w AS n, sum(c.size) OVER w - c.size AS before, lag(c.size) OVER w AS prev
			FROM (SELECT ` + eventColumns + `, octet_length(e.payload) AS size FROM %[1]sevents e
				WHERE (e.topic, e.sequence) > ($1::text, $2::bigint) AND (e.topic, e.sequence) <= ($1::text, 9223372036854775807)
				ORDER BY e.topic, e.sequence LIMIT $4::bigint + 1) c
			WHERE c.sequence <= $3::bigint
			WINDOW w AS (ORDER BY c.sequence ROWS UNBOUNDED PRECEDING)) w
	) p WHERE p.shown ORDER BY p.sequence`
)

// streamLockKey is the advisory lock key of topic's stream transactions:
// FNV-1a of the prefix and the topic, as a bigint.
func streamLockKey(prefix, topic string) int64 {
	h := fnv.New64a()
	h.Write([]byte("replayd stream " + prefix + "\x00" + topic))
	return int64(h.Sum64())
}

// UpdateStreams runs fn in one transaction that holds the advisory locks
// of topics, and commits it if fn returns nil (see the top of this file).
// An error committing that does not prove the transaction rolled back
// wraps replayd.ErrOutcomeUnknown, as Append's do.
func (s *Store) UpdateStreams(ctx context.Context, topics []string, fn func(storage.StreamTx) error) error {
	if s.isClosed() {
		return ErrClosed
	}
	keys := make([]int64, 0, len(topics))
	for _, t := range topics {
		keys = append(keys, streamLockKey(s.prefix, t))
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	for try := 0; ; try++ {
		issued, err := s.updateStreams(ctx, keys, fn)
		if err == nil {
			s.saw(issued)
			return nil
		}
		if try == streamRetries || !retryable(err) || ctx.Err() != nil {
			return err
		}
	}
}

// retryable reports whether err aborted a transaction that may succeed if
// run again: a serialisation failure or a deadlock.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// updateStreams is one try of UpdateStreams; it returns the highest
// sequence the transaction issued.
func (s *Store) updateStreams(ctx context.Context, keys []int64, fn func(storage.StreamTx) error) (int64, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("replaydpg: stream transaction: %w", err)
	}
	// A transaction left open (a ROLLBACK that failed) makes Release close
	// the connection: the server rolls it back.
	defer conn.Release()
	t := &streamTx{s: s, conn: conn}
	t.queue("BEGIN")
	for _, k := range keys {
		t.queue(qStreamLock, k)
	}
	if err := t.send(ctx, nil, nil); err != nil {
		t.rollback()
		return 0, fmt.Errorf("replaydpg: stream transaction: lock: %w", err)
	}
	if err := fn(t); err != nil {
		t.rollback()
		return 0, err
	}
	t.queue("COMMIT")
	if err := t.send(ctx, nil, nil); err != nil {
		t.rollback()
		return 0, fmt.Errorf("replaydpg: stream transaction: commit: %w", appendOutcome(err, nil))
	}
	return t.issued, nil
}

// streamTx is a storage.StreamTx on a connection with an open transaction.
type streamTx struct {
	s       *Store
	conn    *pgxpool.Conn
	pending pgx.Batch // statements sent in front of the next one (see the top of this file)
	tries   int       // of the append's savepoint (see send)
	issued  int64     // the highest sequence appended
}

// queue adds a statement to the pending ones.
func (t *streamTx) queue(sql string, args ...any) {
	t.pending.Queue(sql, args...)
}

// send sends the pending statements, then those queue adds (nil: none),
// in one pipeline; read (nil: none) reads the latter's results.
func (t *streamTx) send(ctx context.Context, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	b := t.pending
	t.pending = pgx.Batch{}
	lead := b.Len()
	if queue != nil {
		queue(&b)
	}
	if b.Len() == 0 {
		return nil
	}
	br := t.conn.SendBatch(ctx, &b)
	err := func() error {
		for range lead {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if read != nil {
			return read(br)
		}
		return nil
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// rollback ends the transaction, if the connection still holds one; a
// failure leaves it to Release, which closes the connection.
func (t *streamTx) rollback() {
	if t.conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_, _ = t.conn.Exec(ctx, "ROLLBACK")
}

func (t *streamTx) Stream(ctx context.Context, topic string) (storage.StreamRecord, bool, error) {
	rec := storage.StreamRecord{Topic: topic}
	found := false
	err := t.send(ctx, func(b *pgx.Batch) {
		b.Queue(t.s.q.streamGet, topic)
	}, func(br pgx.BatchResults) error {
		err := br.QueryRow().Scan(&rec.Meta, &rec.ExpiresAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	if err != nil || !found {
		return storage.StreamRecord{}, false, wrapStream(err)
	}
	return rec, true, nil
}

// Streams reads the records of topics in one statement
// (storage.StreamsReader), sent with the pending writes.
func (t *streamTx) Streams(ctx context.Context, topics []string) ([]storage.StreamRecord, error) {
	var recs []storage.StreamRecord
	err := t.send(ctx, func(b *pgx.Batch) {
		b.Queue(t.s.q.streamsGet, topics)
	}, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err == nil {
			recs, err = pgx.CollectRows(rows, scanStreamRecord)
		}
		return err
	})
	return recs, wrapStream(err)
}

// scanStreamRecord scans a row of topic, meta, expires_at.
func scanStreamRecord(row pgx.CollectableRow) (storage.StreamRecord, error) {
	var rec storage.StreamRecord
	err := row.Scan(&rec.Topic, &rec.Meta, &rec.ExpiresAt)
	return rec, err
}

func (t *streamTx) PutStream(ctx context.Context, rec storage.StreamRecord) error {
	meta := rec.Meta
	if meta == nil {
		meta = []byte{}
	}
	t.queue(t.s.q.streamPut, rec.Topic, meta, rec.ExpiresAt)
	return nil
}

func (t *streamTx) DeleteStream(ctx context.Context, topic string) error {
	t.queue(t.s.q.streamDelete, topic)
	return nil
}

func (t *streamTx) Producer(ctx context.Context, topic, producer string) ([]byte, bool, error) {
	var state []byte
	found := false
	err := t.send(ctx, func(b *pgx.Batch) {
		b.Queue(t.s.q.producerGet, topic, producer)
	}, func(br pgx.BatchResults) error {
		err := br.QueryRow().Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	if err != nil || !found {
		return nil, false, wrapStream(err)
	}
	return state, true, nil
}

func (t *streamTx) PutProducer(ctx context.Context, topic, producer string, state []byte) error {
	if state == nil {
		state = []byte{}
	}
	t.queue(t.s.q.producerPut, topic, producer, state)
	return nil
}

func (t *streamTx) Last(ctx context.Context, topic string) (int64, error) {
	var last int64
	err := t.send(ctx, func(b *pgx.Batch) {
		b.Queue(t.s.q.streamLast, topic)
	}, func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(&last)
	})
	return last, wrapStream(err)
}

// Append appends through Append's path (appendRows), its pipelines sent
// in the transaction by appendSend.
func (t *streamTx) Append(ctx context.Context, evs []storage.Event) ([]storage.AppendResult, error) {
	t.tries = 0
	res, err := t.s.appendRows(ctx, evs, t.appendSend)
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		if r.Err == nil {
			t.issued = max(t.issued, r.Event.Sequence)
		}
	}
	return res, nil
}

// appendSend is the transaction's sender for appendRows: the pending
// writes, a savepoint, then the append's pipeline. Append sends a second
// pipeline after one that failed on an event id already stored: before
// it, the transaction rolls back to the savepoint (which the pending
// writes preceded: they stay).
func (t *streamTx) appendSend(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	if t.tries > 0 {
		if _, err := t.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT stream_append"); err != nil {
			return err
		}
	}
	t.tries++
	t.queue("SAVEPOINT stream_append")
	return t.send(ctx, func(rb *pgx.Batch) {
		rb.QueuedQueries = append(rb.QueuedQueries, b.QueuedQueries...)
	}, read)
}

func wrapStream(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("replaydpg: stream transaction: %w", err)
}

// ReadStream reads the record and a page of req.Topic's own events in one
// REPEATABLE READ READ ONLY transaction, in one round trip. The page is cut
// on the server as Read's is with a MaxBytes (qStreamPage).
func (s *Store) ReadStream(ctx context.Context, req storage.StreamReadRequest) (p storage.StreamPage, err error) {
	if s.isClosed() {
		return p, ErrClosed
	}
	limit := int64(min(defaultLimit(req.Limit), math.MaxInt-1))
	through, maxBytes := req.Through, int64(req.MaxBytes)
	if through <= 0 {
		through = math.MaxInt64
	}
	if maxBytes <= 0 {
		maxBytes = math.MaxInt64
	}
	after := max(req.After, 0)
	b := &pgx.Batch{}
	b.Queue(qBeginSnapshot)
	b.Queue(s.q.streamGet, req.Topic)
	b.Queue(s.q.headForeign, after)
	b.Queue(s.q.streamWatermark, req.Topic)
	b.Queue(s.q.streamLast, req.Topic)
	b.Queue(s.q.streamAt, req.Topic, after)
	b.Queue(s.q.streamPage, req.Topic, after, through, limit, maxBytes)
	b.Queue("COMMIT")
	err = s.snapshot(ctx, b, func(br pgx.BatchResults) error {
		p.Record.Topic = req.Topic
		err := br.QueryRow().Scan(&p.Record.Meta, &p.Record.ExpiresAt)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			p.Record = storage.StreamRecord{}
		case err != nil:
			return err
		default:
			p.Found = true
		}
		if err := br.QueryRow().Scan(&p.Head, &p.Foreign); err != nil {
			return err
		}
		if err := br.QueryRow().Scan(&p.Watermark); err != nil {
			return err
		}
		if err := br.QueryRow().Scan(&p.Last); err != nil {
			return err
		}
		if err := br.QueryRow().Scan(&p.At); err != nil {
			return err
		}
		p.At = p.At && after > 0
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
				keep    bool
			)
			if err := rows.Scan(&ev.Sequence, &ev.EventID, &ev.Type, &topic, &payload, &ev.CreatedAt, &keep); err != nil {
				return err
			}
			if !keep {
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
		return storage.StreamPage{}, fmt.Errorf("replaydpg: read a stream: %w", err)
	}
	s.saw(p.Head)
	return p, nil
}

// DueStreams lists the records due by now, through the partial index on
// expires_at (schema.go), in one statement (one snapshot).
func (s *Store) DueStreams(ctx context.Context, now int64, limit int) ([]storage.StreamRecord, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.pool.Query(ctx, render(qStreamDue, s.prefix), now, limit)
	if err != nil {
		return nil, fmt.Errorf("replaydpg: list due streams: %w", err)
	}
	recs, err := pgx.CollectRows(rows, scanStreamRecord)
	if err != nil {
		return nil, fmt.Errorf("replaydpg: list due streams: %w", err)
	}
	return recs, nil
}
