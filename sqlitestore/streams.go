package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/replayd/replayd/storage"
)

// Durable Streams' state (storage.StreamStore). SQLite has one writer, so
// a transaction begun with BeginTx (which takes the write lock at once) is
// serialised against every other write to the file, in every process: it
// serialises UpdateStreams per topic, and more.

const (
	qStreamGet = `SELECT meta, expires_at FROM events_streams WHERE topic = ?`
	// qStreamsGet is qStreamGet for the topics of a JSON array.
	qStreamsGet = `SELECT topic, meta, expires_at FROM events_streams
		WHERE topic IN (SELECT value FROM json_each(?))`
	qStreamPut = `INSERT INTO events_streams (topic, meta, expires_at) VALUES (?, ?, ?)
		ON CONFLICT (topic) DO UPDATE SET meta = excluded.meta, expires_at = excluded.expires_at`
	qStreamDelete    = `DELETE FROM events_streams WHERE topic = ?`
	qProducersDelete = `DELETE FROM events_stream_producers WHERE topic = ?`
	qProducerGet     = `SELECT state FROM events_stream_producers WHERE topic = ? AND producer = ?`
	qProducerPut     = `INSERT INTO events_stream_producers (topic, producer, state) VALUES (?, ?, ?)
		ON CONFLICT (topic, producer) DO UPDATE SET state = excluded.state`

	qStreamDue = `SELECT topic, meta, expires_at FROM events_streams
		WHERE expires_at > 0 AND expires_at <= ? ORDER BY expires_at, topic LIMIT ?`

	qStreamWatermark = `SELECT coalesce((SELECT sequence FROM events_prune_watermarks WHERE topic = ?), 0)`
	qStreamLast      = `SELECT coalesce(max(sequence), 0) FROM events WHERE topic = ?`
	qStreamAt        = `SELECT EXISTS (SELECT 1 FROM events WHERE topic = ? AND sequence = ?)`
	qStreamEvents    = `SELECT ` + eventColumns + ` FROM events
		WHERE topic = ?1 AND sequence > ?2 AND (?3 = 0 OR sequence <= ?3) ORDER BY sequence LIMIT ?4`
)

// UpdateStreams runs fn in a transaction holding SQLite's write lock (see
// BeginTx) and commits it when fn returns nil.
//
// Group commit: calls queue, and whichever takes the store's writeMu (as
// Append does, so that this process's writes queue on a mutex rather than
// on SQLite's busy handler, which sleeps milliseconds between tries) runs
// every queued call in one transaction, each in a savepoint of its own: a
// call whose fn fails is rolled back to its savepoint alone and gets its
// error; the others commit together, in queue order, each seeing the
// effects of those before it, as if they had run one after another. So
// concurrent writers of many streams pay one commit (one fsync with
// synchronous=FULL) per batch instead of one each. A batch of one call
// needs no savepoint: its failure rolls the transaction back.
func (s *Store) UpdateStreams(ctx context.Context, topics []string, fn func(storage.StreamTx) error) error {
	s.writers.Add(1)
	defer s.writers.Add(-1)
	op := &streamOp{ctx: ctx, fn: fn, done: make(chan struct{})}
	s.streamQ.push(op)
	unlock, err := lockCtx(ctx, &s.writeMu)
	if err != nil {
		if s.streamQ.remove(op) {
			return err // never ran
		}
		<-op.done // taken by a batch already: its outcome
		return op.err
	}
	defer unlock()
	select {
	case <-op.done: // run by the batch before
		return op.err
	default:
	}
	s.runStreams(s.streamQ.take())
	return op.err
}

// streamOp is one UpdateStreams call waiting to run.
type streamOp struct {
	ctx  context.Context
	fn   func(storage.StreamTx) error
	err  error
	done chan struct{} // closed once err is set
}

// streamQueue holds the UpdateStreams calls waiting for writeMu.
type streamQueue struct {
	mu  sync.Mutex
	ops []*streamOp
}

func (q *streamQueue) push(op *streamOp) {
	q.mu.Lock()
	q.ops = append(q.ops, op)
	q.mu.Unlock()
}

// remove takes op out of the queue: false when a batch took it.
func (q *streamQueue) remove(op *streamOp) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, o := range q.ops {
		if o == op {
			q.ops = append(q.ops[:i], q.ops[i+1:]...)
			return true
		}
	}
	return false
}

func (q *streamQueue) take() []*streamOp {
	q.mu.Lock()
	defer q.mu.Unlock()
	ops := q.ops
	q.ops = nil
	return ops
}

// runStreams runs a batch of calls in one transaction, under writeMu,
// and closes their done channels.
func (s *Store) runStreams(batch []*streamOp) {
	fail := func(ops []*streamOp, err error) {
		for _, op := range ops {
			if op.err == nil {
				op.err = err
			}
		}
	}
	defer func() {
		for _, op := range batch {
			close(op.done)
		}
	}()
	if s.closed {
		fail(batch, ErrClosed)
		return
	}
	// The transaction outlives any one call's ctx: each call's statements
	// run under its own.
	ctx := context.WithoutCancel(batch[0].ctx)
	tx, err := s.BeginTx(ctx)
	if err != nil {
		fail(batch, fmt.Errorf("replayd: begin a stream transaction: %w", err))
		return
	}
	defer tx.Rollback()
	var newest int64
	var ran []*streamOp
	savepoints := len(batch) > 1
	for _, op := range batch {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			continue
		}
		seq, err := s.runStreamOp(ctx, tx, op, savepoints)
		if err != nil {
			fail(batch, err)
			return
		}
		if op.err == nil {
			ran = append(ran, op)
			newest = max(newest, seq)
		}
	}
	if len(ran) == 0 {
		return
	}
	if err := tx.Commit(); err != nil {
		fail(ran, fmt.Errorf("replayd: commit a stream transaction: %w", err))
		return
	}
	s.saw(newest) // issued now (see guardHead)
}

// runStreamOp runs op's fn in tx, in a savepoint of its own if savepoint
// (else a failure of op rolls tx back), setting op.err; it returns the
// highest sequence op appended, and the error of a savepoint's statement,
// which leaves the batch's transaction unusable.
func (s *Store) runStreamOp(ctx context.Context, tx *sql.Tx, op *streamOp, savepoint bool) (int64, error) {
	if savepoint {
		if _, err := tx.ExecContext(ctx, "SAVEPOINT stream_op"); err != nil {
			return 0, err
		}
	}
	st := &streamTx{s: s, tx: tx}
	op.err = op.fn(st)
	st.close()
	if !savepoint {
		return st.newest, nil
	}
	if op.err != nil {
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO stream_op"); err != nil {
			return 0, err
		}
	}
	_, err := tx.ExecContext(ctx, "RELEASE stream_op")
	return st.newest, err
}

// streamTx is a storage.StreamTx over a transaction of BeginTx.
type streamTx struct {
	s      *Store
	tx     *sql.Tx
	stmts  map[string]*sql.Stmt // the transaction's statements, by query (stmt)
	newest int64                // the highest sequence appended
}

// stmt returns query as a statement of the transaction, prepared once in
// it (see txStmt); close closes them.
func (t *streamTx) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := t.stmts[query]; ok {
		return st, nil
	}
	st, err := t.s.txStmt(ctx, t.tx, query)
	if err != nil {
		return nil, err
	}
	if t.stmts == nil {
		t.stmts = map[string]*sql.Stmt{}
	}
	t.stmts[query] = st
	return st, nil
}

func (t *streamTx) close() {
	for _, st := range t.stmts {
		st.Close()
	}
}

func (t *streamTx) exec(ctx context.Context, query string, args ...any) error {
	st, err := t.stmt(ctx, query)
	if err == nil {
		_, err = st.ExecContext(ctx, args...)
	}
	return err
}

func (t *streamTx) queryRow(ctx context.Context, query string, args ...any) (*sql.Row, error) {
	st, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryRowContext(ctx, args...), nil
}

func (t *streamTx) Stream(ctx context.Context, topic string) (storage.StreamRecord, bool, error) {
	row, err := t.queryRow(ctx, qStreamGet, topic)
	if err != nil {
		return storage.StreamRecord{}, false, err
	}
	return scanStream(row, topic)
}

// Streams reads the records of topics in one statement
// (storage.StreamsReader).
func (t *streamTx) Streams(ctx context.Context, topics []string) ([]storage.StreamRecord, error) {
	arg, err := json.Marshal(topics)
	if err != nil {
		return nil, err
	}
	st, err := t.stmt(ctx, qStreamsGet)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, string(arg))
	if err != nil {
		return nil, err
	}
	return scanStreams(rows)
}

// scanStreams scans rows of topic, meta, expires_at, and closes them.
func scanStreams(rows *sql.Rows) ([]storage.StreamRecord, error) {
	defer rows.Close()
	var recs []storage.StreamRecord
	for rows.Next() {
		var rec storage.StreamRecord
		if err := rows.Scan(&rec.Topic, &rec.Meta, &rec.ExpiresAt); err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, rows.Err()
}

func (t *streamTx) PutStream(ctx context.Context, rec storage.StreamRecord) error {
	return t.exec(ctx, qStreamPut, rec.Topic, rec.Meta, rec.ExpiresAt)
}

func (t *streamTx) DeleteStream(ctx context.Context, topic string) error {
	if err := t.exec(ctx, qStreamDelete, topic); err != nil {
		return err
	}
	return t.exec(ctx, qProducersDelete, topic)
}

func (t *streamTx) Producer(ctx context.Context, topic, producer string) ([]byte, bool, error) {
	row, err := t.queryRow(ctx, qProducerGet, topic, producer)
	if err != nil {
		return nil, false, err
	}
	var state []byte
	err = row.Scan(&state)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	return state, err == nil, err
}

func (t *streamTx) PutProducer(ctx context.Context, topic, producer string, state []byte) error {
	return t.exec(ctx, qProducerPut, topic, producer, state)
}

func (t *streamTx) Last(ctx context.Context, topic string) (int64, error) {
	row, err := t.queryRow(ctx, qStreamLast, topic)
	if err != nil {
		return 0, err
	}
	var last int64
	err = row.Scan(&last)
	return last, err
}

func (t *streamTx) Append(ctx context.Context, evs []storage.Event) ([]storage.AppendResult, error) {
	res, err := t.s.AppendTx(ctx, t.tx, evs)
	for _, r := range res {
		if r.Err == nil {
			t.newest = max(t.newest, r.Event.Sequence)
		}
	}
	return res, err
}

func getStream(ctx context.Context, q querier, topic string) (storage.StreamRecord, bool, error) {
	return scanStream(q.QueryRowContext(ctx, qStreamGet, topic), topic)
}

// scanStream scans a row of qStreamGet, the record of topic.
func scanStream(row *sql.Row, topic string) (storage.StreamRecord, bool, error) {
	rec := storage.StreamRecord{Topic: topic}
	err := row.Scan(&rec.Meta, &rec.ExpiresAt)
	if errors.Is(err, sql.ErrNoRows) {
		return storage.StreamRecord{}, false, nil
	}
	return rec, err == nil, err
}

// ReadStream reads a stream's record and page in one read transaction.
func (s *Store) ReadStream(ctx context.Context, req storage.StreamReadRequest) (p storage.StreamPage, err error) {
	r := withDefaults(storage.ReadRequest{After: req.After, Through: req.Through, Limit: req.Limit, MaxBytes: req.MaxBytes})
	err = s.readTx(ctx, func(q querier) error {
		var err error
		if p.Record, p.Found, err = getStream(ctx, q, req.Topic); err != nil {
			return err
		}
		if err := q.QueryRowContext(ctx, qHeadForeign, max(r.After, 0)).Scan(&p.Head, &p.Foreign); err != nil {
			return err
		}
		if err := q.QueryRowContext(ctx, qStreamWatermark, req.Topic).Scan(&p.Watermark); err != nil {
			return err
		}
		if err := q.QueryRowContext(ctx, qStreamLast, req.Topic).Scan(&p.Last); err != nil {
			return err
		}
		if r.After > 0 {
			if err := q.QueryRowContext(ctx, qStreamAt, req.Topic, r.After).Scan(&p.At); err != nil {
				return err
			}
		}
		rows, err := q.QueryContext(ctx, qStreamEvents, req.Topic, r.After, r.Through, min(r.Limit, maxInt-1)+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		size := 0
		var sc eventScanner
		for rows.Next() {
			if len(p.Events) == r.Limit || size >= r.MaxBytes {
				p.More = true
				break
			}
			ev, err := sc.scan(rows)
			if err != nil {
				return err
			}
			p.Events = append(p.Events, ev)
			size += len(ev.Payload)
		}
		return rows.Err()
	})
	if err != nil {
		return storage.StreamPage{}, err
	}
	s.saw(p.Head)
	return p, nil
}

// DueStreams lists the records due by now, through the partial index on
// expires_at (schema.go).
func (s *Store) DueStreams(ctx context.Context, now int64, limit int) (recs []storage.StreamRecord, err error) {
	if limit <= 0 {
		limit = 100
	}
	err = s.readTx(ctx, func(q querier) error {
		rows, err := q.QueryContext(ctx, qStreamDue, now, limit)
		if err != nil {
			return err
		}
		recs, err = scanStreams(rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("replayd: list due streams: %w", err)
	}
	return recs, nil
}
