package replayd

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"modernc.org/sqlite"
)

// The schema. One append-only table holds every event; a second, tiny table
// holds the prune watermarks (§3 of the spec). Topic is NULL for broadcasts in
// the events table and the empty string in the watermark table, where it is
// a primary key.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS events (
		sequence   INTEGER PRIMARY KEY AUTOINCREMENT,
		event_id   TEXT    NOT NULL UNIQUE,
		type       TEXT    NOT NULL,
		topic      TEXT,
		payload    TEXT    NOT NULL,
		created_at INTEGER NOT NULL -- unix milliseconds, never decreasing
	)`,
	`CREATE INDEX IF NOT EXISTS events_topic_sequence ON events (topic, sequence)`,
	`CREATE TABLE IF NOT EXISTS events_prune_watermarks (
		topic    TEXT    PRIMARY KEY, -- '' for broadcasts
		sequence INTEGER NOT NULL
	) WITHOUT ROWID`,
}

const eventColumns = `sequence, event_id, type, topic, payload, created_at`

// Reads. A topic scope is a UNION ALL of two index range scans on
// (topic, sequence), one for the topic and one for broadcasts, which SQLite
// merges by sequence without sorting. The obvious
// "(topic = ? OR topic IS NULL)" plans as a MULTI-INDEX OR plus a temporary
// B-tree sort and measured about five times slower on a million rows;
// TestReplayQueryPlans pins the plans.
const (
	qReplayGlobal = `SELECT ` + eventColumns + ` FROM events
		WHERE sequence > ?2 ORDER BY sequence LIMIT ?3`
	qReplayTopic = `SELECT ` + eventColumns + ` FROM events WHERE topic = ?1 AND sequence > ?2
		UNION ALL
		SELECT ` + eventColumns + ` FROM events WHERE topic IS NULL AND sequence > ?2
		ORDER BY sequence LIMIT ?3`

	qLatestGlobal = `SELECT ` + eventColumns + ` FROM events
		WHERE sequence > ?2 AND sequence <= ?4 ORDER BY sequence DESC LIMIT ?3`
	qLatestTopic = `SELECT ` + eventColumns + ` FROM events WHERE topic = ?1 AND sequence > ?2 AND sequence <= ?4
		UNION ALL
		SELECT ` + eventColumns + ` FROM events WHERE topic IS NULL AND sequence > ?2 AND sequence <= ?4
		ORDER BY sequence DESC LIMIT ?3`

	qSpanGlobal = `SELECT count(*), coalesce(min(sequence), 0), coalesce(max(sequence), 0) FROM events
		WHERE sequence > ?2 AND sequence < ?3`
	qSpanTopic = `SELECT count(*), coalesce(min(sequence), 0), coalesce(max(sequence), 0) FROM (
		SELECT sequence FROM events WHERE topic = ?1 AND sequence > ?2 AND sequence < ?3
		UNION ALL
		SELECT sequence FROM events WHERE topic IS NULL AND sequence > ?2 AND sequence < ?3)`

	qSchemaColumns = `SELECT count(*) FROM pragma_table_info('events')
		WHERE name IN ('sequence', 'event_id', 'type', 'topic', 'payload', 'created_at')`

	qHead = `SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)`

	qWatermarkGlobal = `SELECT coalesce(max(sequence), 0) FROM events_prune_watermarks`
	qWatermarkTopic  = `SELECT coalesce(max(sequence), 0) FROM events_prune_watermarks WHERE topic IN (?1, '')`
)

// Writes.
const (
	qLastCreatedAt = `SELECT coalesce((SELECT created_at FROM events ORDER BY sequence DESC LIMIT 1), 0)`
	qInsert        = `INSERT INTO events (event_id, type, topic, payload, created_at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (event_id) DO NOTHING`
	qByEventID = `SELECT ` + eventColumns + ` FROM events WHERE event_id = ?`

	qPruneHead      = `SELECT sequence, topic, created_at FROM events ORDER BY sequence LIMIT ?`
	qPruneCountEdge = `SELECT coalesce((SELECT sequence FROM events ORDER BY sequence DESC LIMIT 1 OFFSET ?), 0)`
	qPruneDelete    = `DELETE FROM events WHERE sequence <= ?`
	qPruneMark      = `INSERT INTO events_prune_watermarks (topic, sequence) VALUES (?, ?)
		ON CONFLICT (topic) DO UPDATE SET sequence = max(sequence, excluded.sequence)`
)

// pruneBatch is how many rows one retention transaction deletes at most, so
// a large prune holds the write lock for milliseconds at a time.
const pruneBatch = 1000

// EventLog is the durable, append-only log behind a hub: one SQLite table
// whose row sequence is the SSE id. Its read methods are the ones the SSE
// handler uses, exported for people building their own transport. Everywhere
// a topic names a scope, "" is the global scope (every event); a named topic's
// scope is its own events plus broadcasts.
//
// An EventLog is safe for concurrent use. Obtain one with EventHub.Log.
type EventLog struct {
	db     *sql.DB
	writer *logWriter // appendBatch's connection; guarded by the hub's writeMu
}

// querier is what both *sql.DB and *sql.Tx offer for reads.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// topicArg is the SQL value of a topic: NULL for a broadcast.
func topicArg(topic string) any {
	if topic == "" {
		return nil
	}
	return topic
}

// Replay returns up to limit of the oldest events visible to topic whose
// sequence is above since, in ascending order. limit <= 0 means 100.
func (l *EventLog) Replay(ctx context.Context, topic string, since int64, limit int) ([]Event, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	evs, err := l.replay(ctx, l.db, topic, since, defaultLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("replayd: replay: %w", err)
	}
	return evs, nil
}

// ReplayLatest returns the newest window of up to limit events visible to
// topic whose sequence is above since, in ascending order: what a client
// that fell behind is replayed. limit <= 0 means 100.
func (l *EventLog) ReplayLatest(ctx context.Context, topic string, since int64, limit int) ([]Event, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	evs, err := l.replayLatest(ctx, l.db, topic, since, maxSequence, defaultLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("replayd: replay latest: %w", err)
	}
	return evs, nil
}

// CountBetween counts the retained events visible to topic whose sequence
// is strictly between after and before.
func (l *EventLog) CountBetween(ctx context.Context, topic string, after, before int64) (int64, error) {
	if err := validateTopic(topic); err != nil {
		return 0, err
	}
	s, err := l.span(ctx, l.db, topic, after, before)
	if err != nil {
		return 0, fmt.Errorf("replayd: count: %w", err)
	}
	return s.count, nil
}

// LatestSequence returns the head: the highest sequence ever assigned. It
// never goes backwards, even when retention has deleted every row.
func (l *EventLog) LatestSequence(ctx context.Context) (int64, error) {
	head, err := l.head(ctx, l.db)
	if err != nil {
		return 0, fmt.Errorf("replayd: latest sequence: %w", err)
	}
	return head, nil
}

const maxSequence = 1<<63 - 1

func defaultLimit(limit int) int {
	if limit <= 0 {
		return 100
	}
	return limit
}

func (l *EventLog) ensureSchema(ctx context.Context) error {
	return l.writeTx(ctx, func(conn *sql.Conn) error {
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
		}
		return nil
	})
}

func (l *EventLog) head(ctx context.Context, q querier) (int64, error) {
	var head int64
	err := q.QueryRowContext(ctx, qHead).Scan(&head)
	return head, err
}

func (l *EventLog) replay(ctx context.Context, q querier, topic string, since int64, limit int) ([]Event, error) {
	query := qReplayGlobal
	if topic != "" {
		query = qReplayTopic
	}
	return scanEvents(q.QueryContext(ctx, query, topic, since, limit))
}

// replayLatest returns the newest limit events visible to topic in
// (since, through], ascending.
func (l *EventLog) replayLatest(ctx context.Context, q querier, topic string, since, through int64, limit int) ([]Event, error) {
	query := qLatestGlobal
	if topic != "" {
		query = qLatestTopic
	}
	evs, err := scanEvents(q.QueryContext(ctx, query, topic, since, limit, through))
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	return evs, err
}

// span describes the visible events in a range: how many, first and last.
type span struct{ count, first, last int64 }

func (l *EventLog) span(ctx context.Context, q querier, topic string, after, before int64) (span, error) {
	query := qSpanGlobal
	if topic != "" {
		query = qSpanTopic
	}
	var s span
	err := q.QueryRowContext(ctx, query, topic, after, before).Scan(&s.count, &s.first, &s.last)
	return s, err
}

// watermark returns the highest prune watermark that applies to topic's
// scope: the topic's own and the broadcasts', or any topic's for "".
func (l *EventLog) watermark(ctx context.Context, q querier, topic string) (int64, error) {
	query := qWatermarkGlobal
	if topic != "" {
		query = qWatermarkTopic
	}
	var p int64
	err := q.QueryRowContext(ctx, query, topic).Scan(&p)
	return p, err
}

// handshake is what a connecting client needs from the log, read in one
// snapshot so the replay window, the skipped range and the prune watermark
// agree with each other and with head.
type handshake struct {
	head      int64
	replay    []Event // W: the newest window above the cursor, ascending
	skipped   span    // M: visible events above the cursor older than W
	watermark int64   // P
}

// readHandshake reads, in one read transaction, the head and, when cursor is
// below it, the replay window of at most limit events above cursor, the
// skipped events below that window, and the prune watermark. A negative
// cursor means a fresh client: only the head is read.
func (l *EventLog) readHandshake(ctx context.Context, topic string, cursor int64, limit int) (hs handshake, err error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return hs, err
	}
	defer func() {
		if cerr := tx.Commit(); err == nil {
			err = cerr
		}
	}()
	if hs.head, err = l.head(ctx, tx); err != nil || cursor < 0 || cursor >= hs.head {
		return hs, err
	}
	if limit > 0 {
		if hs.replay, err = l.replayLatest(ctx, tx, topic, cursor, hs.head, limit); err != nil {
			return hs, err
		}
	}
	before := hs.head + 1
	if len(hs.replay) > 0 {
		before = hs.replay[0].Sequence
	}
	if hs.skipped, err = l.span(ctx, tx, topic, cursor, before); err != nil {
		return hs, err
	}
	hs.watermark, err = l.watermark(ctx, tx, topic)
	return hs, err
}

func scanEvents(rows *sql.Rows, err error) ([]Event, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var evs []Event
	for rows.Next() {
		ev, err := scanEvent(rows)
		if err != nil {
			return nil, err
		}
		evs = append(evs, ev)
	}
	return evs, rows.Err()
}

func scanEvent(row interface{ Scan(...any) error }) (Event, error) {
	var (
		ev      Event
		topic   sql.NullString
		payload string
		created int64
	)
	if err := row.Scan(&ev.Sequence, &ev.EventID, &ev.Type, &topic, &payload, &created); err != nil {
		return ev, err
	}
	ev.Topic = topic.String
	ev.Payload = json.RawMessage(payload)
	ev.CreatedAt = time.UnixMilli(created)
	return ev, nil
}

// writeTx runs fn inside BEGIN IMMEDIATE on one pooled connection, so the
// write lock is taken up front and a busy database is waited for by the busy
// timeout instead of failing a deferred transaction's upgrade.
func (l *EventLog) writeTx(ctx context.Context, fn func(*sql.Conn) error) (err error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := retryBusy(ctx, func() error {
		_, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		return err
	}); err != nil {
		return err
	}
	if err := fn(conn); err != nil {
		// Rollback with a fresh context: a cancelled one must not leave the
		// connection inside a transaction when it goes back to the pool.
		if _, rerr := conn.ExecContext(context.Background(), "ROLLBACK"); rerr != nil {
			discard(conn)
		}
		return err
	}
	if _, err := conn.ExecContext(context.Background(), "COMMIT"); err != nil {
		if _, rerr := conn.ExecContext(context.Background(), "ROLLBACK"); rerr != nil {
			discard(conn)
		}
		return err
	}
	return nil
}

// retryBusy runs begin, a BEGIN IMMEDIATE, until it gets the write lock.
// The busy timeout of OpenDB's connections already waits for another
// process's lock; this retries a busy answer anyway, for a *sql.DB opened
// without one.
func retryBusy(ctx context.Context, begin func() error) error {
	deadline := time.Now().Add(busyWait)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := begin()
		var se *sqlite.Error
		if err == nil || !errors.As(err, &se) || se.Code()&0xff != sqliteBusy || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// sqliteBusy is SQLITE_BUSY, the primary result code of a locked database.
const sqliteBusy = 5

// discard makes database/sql drop conn instead of pooling it.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// prune deletes, in batches of pruneBatch, the oldest rows that policy
// condemns, recording each topic's prune watermark in the same transaction
// as the delete. It returns how many rows it deleted.
func (l *EventLog) prune(ctx context.Context, policy RetentionPolicy, lock func() func()) (int64, error) {
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return 0, nil
	}
	var countEdge int64 // rows at or below this sequence exceed MaxEvents
	if policy.MaxEvents > 0 {
		if err := l.db.QueryRowContext(ctx, qPruneCountEdge, policy.MaxEvents).Scan(&countEdge); err != nil {
			return 0, err
		}
	}
	var ageEdge int64 = -1 << 63 // rows created before this are too old
	if policy.MaxAge > 0 {
		ageEdge = time.Now().Add(-policy.MaxAge).UnixMilli()
	}
	var deleted int64
	for {
		n, err := l.pruneOnce(ctx, countEdge, ageEdge, lock)
		deleted += n
		if err != nil || n < pruneBatch {
			return deleted, err
		}
	}
}

func (l *EventLog) pruneOnce(ctx context.Context, countEdge, ageEdge int64, lock func() func()) (deleted int64, err error) {
	defer lock()()
	err = l.writeTx(ctx, func(conn *sql.Conn) error {
		rows, err := conn.QueryContext(ctx, qPruneHead, pruneBatch)
		if err != nil {
			return err
		}
		// The condemned rows are a prefix of the log: created_at never
		// decreases as the sequence grows, so stop at the first row kept.
		marks := map[string]int64{}
		var through int64
		for rows.Next() {
			var (
				seq, created int64
				topic        sql.NullString
			)
			if err := rows.Scan(&seq, &topic, &created); err != nil {
				rows.Close()
				return err
			}
			if seq > countEdge && created >= ageEdge {
				break
			}
			through = seq
			marks[topic.String] = seq
			deleted++
		}
		rows.Close()
		if err := rows.Err(); err != nil || deleted == 0 {
			return err
		}
		if _, err := conn.ExecContext(ctx, qPruneDelete, through); err != nil {
			return err
		}
		for topic, seq := range marks {
			if _, err := conn.ExecContext(ctx, qPruneMark, topic, seq); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return deleted, nil
}
