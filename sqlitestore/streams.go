package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/replayd/replayd/storage"
)

// Durable Streams' state (storage.StreamStore). SQLite has one writer, so
// a transaction begun with BeginTx (which takes the write lock at once) is
// serialised against every other write to the file, in every process: it
// serialises UpdateStreams per topic, and more.

const (
	qStreamGet = `SELECT meta, expires_at FROM events_streams WHERE topic = ?`
	qStreamPut = `INSERT INTO events_streams (topic, meta, expires_at) VALUES (?, ?, ?)
		ON CONFLICT (topic) DO UPDATE SET meta = excluded.meta, expires_at = excluded.expires_at`
	qStreamDelete    = `DELETE FROM events_streams WHERE topic = ?`
	qProducersDelete = `DELETE FROM events_stream_producers WHERE topic = ?`
	qProducerGet     = `SELECT state FROM events_stream_producers WHERE topic = ? AND producer = ?`
	qProducerPut     = `INSERT INTO events_stream_producers (topic, producer, state) VALUES (?, ?, ?)
		ON CONFLICT (topic, producer) DO UPDATE SET state = excluded.state`

	qStreamWatermark = `SELECT coalesce((SELECT sequence FROM events_prune_watermarks WHERE topic = ?), 0)`
	qStreamLast      = `SELECT coalesce(max(sequence), 0) FROM events WHERE topic = ?`
	qStreamAt        = `SELECT EXISTS (SELECT 1 FROM events WHERE topic = ? AND sequence = ?)`
	qStreamEvents    = `SELECT ` + eventColumns + ` FROM events
		WHERE topic = ?1 AND sequence > ?2 AND (?3 = 0 OR sequence <= ?3) ORDER BY sequence LIMIT ?4`
)

// UpdateStreams runs fn in a transaction holding SQLite's write lock (see
// BeginTx) and commits it when fn returns nil.
func (s *Store) UpdateStreams(ctx context.Context, topics []string, fn func(storage.StreamTx) error) error {
	tx, err := s.BeginTx(ctx)
	if err != nil {
		return fmt.Errorf("replayd: begin a stream transaction: %w", err)
	}
	defer tx.Rollback()
	st := &streamTx{s: s, tx: tx}
	if err := fn(st); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("replayd: commit a stream transaction: %w", err)
	}
	// Committed: its sequences were issued, and a log restored in place
	// under the store must not issue them again (guardHead).
	s.saw(st.last)
	return nil
}

// streamTx is a storage.StreamTx over a transaction of BeginTx.
type streamTx struct {
	s    *Store
	tx   *sql.Tx
	last int64 // the highest sequence Append gave in tx
}

func (t *streamTx) Stream(ctx context.Context, topic string) (storage.StreamRecord, bool, error) {
	return getStream(ctx, t.tx, topic)
}

func (t *streamTx) PutStream(ctx context.Context, rec storage.StreamRecord) error {
	_, err := t.tx.ExecContext(ctx, qStreamPut, rec.Topic, rec.Meta, rec.ExpiresAt)
	return err
}

func (t *streamTx) DeleteStream(ctx context.Context, topic string) error {
	if _, err := t.tx.ExecContext(ctx, qStreamDelete, topic); err != nil {
		return err
	}
	_, err := t.tx.ExecContext(ctx, qProducersDelete, topic)
	return err
}

func (t *streamTx) Producer(ctx context.Context, topic, producer string) ([]byte, bool, error) {
	var state []byte
	err := t.tx.QueryRowContext(ctx, qProducerGet, topic, producer).Scan(&state)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	return state, err == nil, err
}

func (t *streamTx) PutProducer(ctx context.Context, topic, producer string, state []byte) error {
	_, err := t.tx.ExecContext(ctx, qProducerPut, topic, producer, state)
	return err
}

func (t *streamTx) Last(ctx context.Context, topic string) (int64, error) {
	var last int64
	err := t.tx.QueryRowContext(ctx, qStreamLast, topic).Scan(&last)
	return last, err
}

func (t *streamTx) Append(ctx context.Context, evs []storage.Event) ([]storage.AppendResult, error) {
	res, err := t.s.AppendTx(ctx, t.tx, evs)
	for _, r := range res {
		if r.Err == nil && !r.Duplicate {
			t.last = max(t.last, r.Event.Sequence)
		}
	}
	return res, err
}

func getStream(ctx context.Context, q querier, topic string) (storage.StreamRecord, bool, error) {
	rec := storage.StreamRecord{Topic: topic}
	err := q.QueryRowContext(ctx, qStreamGet, topic).Scan(&rec.Meta, &rec.ExpiresAt)
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
