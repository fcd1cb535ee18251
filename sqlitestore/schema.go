package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// The schema. One append-only table holds every event; a second, tiny table
// holds the prune watermarks (see Store). Topic is NULL for broadcasts in
// the events table and the empty string in the watermark table, where it is
// a primary key.
//
// ordinal numbers the rows of the log 1, 2, 3, ... and topic_ordinal the
// rows of each topic (broadcasts counting as one topic), both assigned by
// the writer inside the write transaction. Counting a scope's rows in a
// range is then a difference of ordinals found by index, whatever the
// range's size (see span). Databases made before these columns get them in
// ensureSchema.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS events (
		sequence      INTEGER PRIMARY KEY AUTOINCREMENT,
		event_id      TEXT    NOT NULL UNIQUE,
		type          TEXT    NOT NULL,
		topic         TEXT,
		payload       TEXT    NOT NULL,
		created_at    INTEGER NOT NULL, -- unix milliseconds, never decreasing
		ordinal       INTEGER,          -- among all rows; NULL: not yet migrated
		topic_ordinal INTEGER           -- among the topic's rows (or broadcasts')
	)`,
	`CREATE TABLE IF NOT EXISTS events_prune_watermarks (
		topic    TEXT    PRIMARY KEY, -- '' for broadcasts
		sequence INTEGER NOT NULL
	) WITHOUT ROWID`,
	// The sequence floor's skipped ranges (see floor.go): sequences
	// strictly between after and through were never issued by this log.
	`CREATE TABLE IF NOT EXISTS events_skips (
		after   INTEGER PRIMARY KEY, -- the head when the log was opened
		through INTEGER NOT NULL     -- the head it was raised to
	)`,
	// Durable Streams' state (streams.go): a record per stream, opaque to
	// the store, and the state of each idempotent producer of a stream.
	`CREATE TABLE IF NOT EXISTS events_streams (
		topic      TEXT    PRIMARY KEY,
		meta       BLOB    NOT NULL,
		expires_at INTEGER NOT NULL -- unix milliseconds; 0: never
	) WITHOUT ROWID`,
	`CREATE TABLE IF NOT EXISTS events_stream_producers (
		topic    TEXT NOT NULL,
		producer TEXT NOT NULL,
		state    BLOB NOT NULL,
		PRIMARY KEY (topic, producer)
	) WITHOUT ROWID`,
	// The records the Durable Streams sweep must look at (DueStreams).
	`CREATE INDEX IF NOT EXISTS events_streams_due ON events_streams (expires_at, topic) WHERE expires_at > 0`,
}

// The topic index covers topic_ordinal, so a count reads no table row.
// It replaces the (topic, sequence) index of earlier versions.
const (
	qCreateTopicIndex = `CREATE INDEX IF NOT EXISTS events_topic_sequence_ordinal ON events (topic, sequence, topic_ordinal)`
	qDropOldIndex     = `DROP INDEX IF EXISTS events_topic_sequence`
	qHasOrdinals      = `SELECT count(*) FROM pragma_table_info('events') WHERE name IN ('ordinal', 'topic_ordinal')`
	qAddOrdinal       = `ALTER TABLE events ADD COLUMN ordinal INTEGER`
	qAddTopicOrdinal  = `ALTER TABLE events ADD COLUMN topic_ordinal INTEGER`
	qUnmigrated       = `SELECT ordinal IS NULL FROM events ORDER BY sequence DESC LIMIT 1`
	qBackfillRows     = `SELECT sequence, topic, ordinal, topic_ordinal FROM events
		WHERE sequence > ? ORDER BY sequence LIMIT ?`
	qFirstFrom    = `SELECT ordinal IS NULL FROM events WHERE sequence >= ? ORDER BY sequence LIMIT 1`
	qBackfillPrev = `SELECT ordinal FROM events WHERE sequence <= ? ORDER BY sequence DESC LIMIT 1`
	qBackfillSet  = `UPDATE events SET ordinal = ?, topic_ordinal = ? WHERE sequence = ?`
)

func (s *Store) ensureSchema(ctx context.Context) error {
	err := s.writeTx(ctx, func(conn *sql.Conn) error {
		for i, stmt := range schema {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return err
			}
			if i > 0 {
				continue
			}
			// CREATE TABLE IF NOT EXISTS keeps a table of the same name that
			// an application made for itself: refuse it rather than fail later.
			var n int
			if err := conn.QueryRowContext(ctx, qSchemaColumns).Scan(&n); err != nil {
				return err
			}
			if n != 6 {
				return errors.New("table events exists but is not replayd's (sequence, event_id, type, topic, payload, created_at)")
			}
			// A table made by an earlier version lacks the ordinals.
			if err := conn.QueryRowContext(ctx, qHasOrdinals).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				for _, q := range []string{qAddOrdinal, qAddTopicOrdinal} {
					if _, err := conn.ExecContext(ctx, q); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.backfillOrdinals(ctx); err != nil {
		return fmt.Errorf("number the rows of an earlier version: %w", err)
	}
	return s.writeTx(ctx, func(conn *sql.Conn) error {
		for _, q := range []string{qCreateTopicIndex, qDropOldIndex} {
			if _, err := conn.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
}

// backfillBatch is how many rows one backfill transaction numbers.
const backfillBatch = 2000

// backfillOrdinals numbers the rows that have no ordinals yet, oldest first,
// in transactions of backfillBatch rows, so another process's publishes
// interleave. Unnumbered rows are always a suffix of the log: the writer
// leaves a row unnumbered only while the newest row is (see insertRows),
// and this numbers them in sequence order. Until it is done, counts fall
// back to reading rows (see span).
func (s *Store) backfillOrdinals(ctx context.Context) error {
	var (
		pending bool
		head    int64
	)
	err := s.db.QueryRowContext(ctx, qUnmigrated).Scan(&pending)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !pending) {
		return nil
	}
	if err != nil {
		return err
	}
	// Unnumbered rows are a suffix: find where it starts by bisection, so
	// that a numbering interrupted (New's deadline, a crash) resumes there.
	var after int64 // every row up to here is numbered
	if err := s.db.QueryRowContext(ctx, qHead).Scan(&head); err != nil {
		return err
	}
	for lo, hi := int64(0), head; lo < hi; {
		mid := lo + (hi-lo+1)/2
		var unnumbered bool
		err := s.db.QueryRowContext(ctx, qFirstFrom, mid).Scan(&unnumbered)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if err == nil && !unnumbered {
			lo = mid // the first row at or above mid is numbered
		} else {
			hi = mid - 1
		}
		after = lo
	}
	for {
		var n int
		err := s.writeTx(ctx, func(conn *sql.Conn) error {
			var err error
			n, after, err = backfillOnce(ctx, conn, after)
			return err
		})
		if err != nil || n < backfillBatch {
			return err
		}
	}
}

// backfillOnce numbers up to backfillBatch rows above after, inside a write
// transaction, and returns how many rows it visited and the last one.
func backfillOnce(ctx context.Context, conn *sql.Conn, after int64) (int, int64, error) {
	var prev sql.NullInt64 // the ordinal of the newest row at or below after
	if err := conn.QueryRowContext(ctx, qBackfillPrev, after).Scan(&prev); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, after, err
	}
	type row struct {
		seq       int64
		topic     sql.NullString
		ord, tord sql.NullInt64
	}
	rows, err := conn.QueryContext(ctx, qBackfillRows, after, backfillBatch)
	if err != nil {
		return 0, after, err
	}
	var batch []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.seq, &r.topic, &r.ord, &r.tord); err != nil {
			rows.Close()
			return 0, after, err
		}
		batch = append(batch, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, after, err
	}
	ord := prev.Int64
	tords := map[string]int64{} // topic ("" = broadcasts) -> its last ordinal
	for _, r := range batch {
		t := r.topic.String
		if r.ord.Valid && r.tord.Valid { // numbered already, by another process
			ord, tords[t] = r.ord.Int64, r.tord.Int64
			continue
		}
		tord, ok := tords[t]
		if !ok {
			if tord, err = lastTopicOrdinal(ctx, conn, t, r.seq); err != nil {
				return 0, after, err
			}
		}
		ord, tord = ord+1, tord+1
		if _, err := conn.ExecContext(ctx, qBackfillSet, ord, tord, r.seq); err != nil {
			return 0, after, err
		}
		tords[t] = tord
	}
	if len(batch) > 0 {
		after = batch[len(batch)-1].seq
	}
	return len(batch), after, nil
}

// lastTopicOrdinal returns the topic ordinal of topic's newest row below
// before, or 0 if it has none.
func lastTopicOrdinal(ctx context.Context, q querier, topic string, before int64) (int64, error) {
	query := `SELECT topic_ordinal FROM events WHERE topic = ?1 AND sequence < ?2 ORDER BY sequence DESC LIMIT 1`
	if topic == "" {
		query = `SELECT topic_ordinal FROM events WHERE topic IS NULL AND sequence < ?2 ORDER BY sequence DESC LIMIT 1`
	}
	var o sql.NullInt64
	err := q.QueryRowContext(ctx, query, topic, before).Scan(&o)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return o.Int64, err
}
