package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/replayd/replayd/storage"
	"log/slog"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
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

const eventColumns = `sequence, event_id, type, topic, payload, created_at`

// Reads. A scope of n topics is a UNION ALL of n+1 index range scans on
// (topic, sequence), one per topic and one for broadcasts, which SQLite
// merges by sequence without sorting. The obvious
// "(topic IN (...) OR topic IS NULL)" plans as a MULTI-INDEX OR plus a
// temporary B-tree sort and measured about five times slower on a million
// rows; TestReplayQueryPlans pins the plans. Parameters: ?1..?n are the
// topics, then after, through (or before) and limit.
const (
	qSchemaColumns = `SELECT count(*) FROM pragma_table_info('events')
		WHERE name IN ('sequence', 'event_id', 'type', 'topic', 'payload', 'created_at')`

	qHead = `SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)`

	// qHeadForeign: the head, and whether the cursor ?1 is foreign to the
	// log (see foreignSQL).
	qHeadForeign = `SELECT h, ` + foreignSQL + ` FROM (SELECT (` + qHead + `) AS h, ?1 AS c)`

	qWatermarkGlobal = `SELECT coalesce(max(sequence), 0) FROM events_prune_watermarks`
)

// Query kinds built per scope size by scopeQuery.
const (
	kindReplay    = iota // rows in (after, through], ascending, limit
	kindLatest           // rows in (after, through], descending, limit
	kindBoundary         // the sequence of the limit-th newest row in (after, through]
	kindOrdinals         // per branch: first and last row in (after, before) with their ordinals
	kindCount            // count, first and last in (after, before), row by row
	kindWatermark        // the highest prune watermark of the scope
	kindPage             // one row of head and watermark, then kindReplay's rows
)

// scopeQueries caches scopeQuery's text by kind and number of topics.
var scopeQueries sync.Map // [2]int -> string

// scopeQuery returns the SQL of kind for a scope of n topics (0: global).
func scopeQuery(kind, n int) string {
	key := [2]int{kind, n}
	if q, ok := scopeQueries.Load(key); ok {
		return q.(string)
	}
	q := buildScopeQuery(kind, n)
	scopeQueries.Store(key, q)
	return q
}

func buildScopeQuery(kind, n int) string {
	after, upper, limit := fmt.Sprintf("?%d", n+1), fmt.Sprintf("?%d", n+2), fmt.Sprintf("?%d", n+3)
	// where returns branch i's condition: topic ?i, broadcasts for i == 0,
	// every row for a global scope.
	where := func(i int, cmp string) string {
		r := "sequence > " + after + " AND sequence " + cmp + " " + upper
		switch {
		case n == 0:
			return r
		case i == 0:
			return "topic IS NULL AND " + r
		}
		return fmt.Sprintf("topic = ?%d AND %s", i, r)
	}
	branches := func(f func(i int) string) string {
		if n == 0 {
			return f(0)
		}
		parts := make([]string, 0, n+1)
		for i := 1; i <= n; i++ {
			parts = append(parts, f(i))
		}
		parts = append(parts, f(0))
		return strings.Join(parts, "\n\t\tUNION ALL\n\t\t")
	}
	switch kind {
	case kindReplay, kindLatest:
		order := "sequence"
		if kind == kindLatest {
			order = "sequence DESC"
		}
		return branches(func(i int) string {
			return "SELECT " + eventColumns + " FROM events WHERE " + where(i, "<=")
		}) + " ORDER BY " + order + " LIMIT " + limit
	case kindBoundary:
		return `SELECT sequence FROM (` + branches(func(i int) string {
			return "SELECT sequence FROM events WHERE " + where(i, "<=")
		}) + " ORDER BY sequence DESC LIMIT 1 OFFSET " + limit + " - 1)"
	case kindOrdinals:
		col := "topic_ordinal"
		if n == 0 {
			col = "ordinal"
		}
		return branches(func(i int) string {
			first := fmt.Sprintf("SELECT %d, 0, sequence, o FROM (SELECT sequence, %s AS o FROM events WHERE %s ORDER BY sequence LIMIT 1)", i, col, where(i, "<"))
			last := fmt.Sprintf("SELECT %d, 1, sequence, o FROM (SELECT sequence, %s AS o FROM events WHERE %s ORDER BY sequence DESC LIMIT 1)", i, col, where(i, "<"))
			return first + "\n\t\tUNION ALL\n\t\t" + last
		})
	case kindCount:
		return `SELECT count(*), coalesce(min(sequence), 0), coalesce(max(sequence), 0) FROM (` +
			branches(func(i int) string { return "SELECT sequence FROM events WHERE " + where(i, "<") }) + ")"
	case kindWatermark:
		if n == 0 {
			return qWatermarkGlobal
		}
		in := make([]string, 0, n+1)
		for i := 1; i <= n; i++ {
			in = append(in, fmt.Sprintf("?%d", i))
		}
		in = append(in, "''")
		return qWatermarkGlobal + " WHERE topic IN (" + strings.Join(in, ", ") + ")"
	case kindPage:
		// One statement is one snapshot: SQLite holds its read
		// transaction from the first step to the reset. The first row
		// (event_id NULL, which no event has) is the head and the
		// watermark; UNION ALL returns its members in order.
		wm := qWatermarkGlobal
		if n > 0 {
			wm = `SELECT coalesce(max(sequence), 0) FROM (` + branches(func(i int) string {
				if i == 0 {
					return `SELECT sequence FROM events_prune_watermarks WHERE topic = ''`
				}
				return fmt.Sprintf("SELECT sequence FROM events_prune_watermarks WHERE topic = ?%d", i)
			}) + ")"
		}
		// Its fourth column tells whether after is a foreign cursor.
		foreign := "SELECT " + foreignSQL + " FROM (SELECT (" + qHead + ") AS h, " + after + " AS c)"
		return "SELECT (" + qHead + "), (" + wm + "), NULL, (" + foreign + "), NULL, NULL" +
			"\n\t\tUNION ALL\n\t\tSELECT * FROM (" + buildScopeQuery(kindReplay, n) + ")"
	}
	panic("replayd: unknown query kind")
}

// scopeArgs returns the arguments of a scope query: the topics, then rest.
func scopeArgs(topics []string, rest ...any) []any {
	args := make([]any, 0, len(topics)+len(rest))
	for _, t := range topics {
		args = append(args, t)
	}
	return append(args, rest...)
}

// Writes.
const (
	qLastRow          = `SELECT sequence, created_at, ordinal FROM events ORDER BY sequence DESC LIMIT 1`
	qLastTopicOrdinal = `SELECT topic_ordinal FROM events WHERE topic = ? ORDER BY sequence DESC LIMIT 1`
	qLastBroadcastOrd = `SELECT topic_ordinal FROM events WHERE topic IS NULL ORDER BY sequence DESC LIMIT 1`
	qInsert           = `INSERT INTO events (event_id, type, topic, payload, created_at, ordinal, topic_ordinal)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING`
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

// Store is the SQLite [storage.Store]: one table whose row sequence is the
// SSE id, and a tiny one of prune watermarks. It serialises this process's
// writes (appends, prune batches, schema, the Ready probe) on writeMu, so
// they queue here instead of in SQLite's sleeping busy handler; other
// processes' writes are waited for by the busy timeout.
type Store struct {
	db     *sql.DB
	file   *fileGuard   // the database file's identity (see fileid.go), checked before appends
	stmts  stmtCache    // the reads' prepared statements
	logger *slog.Logger // nil: discard

	// writeMu serialises the write transactions of this store and guards
	// writer and closed.
	writeMu sync.Mutex
	writer  *logWriter // Append's connection
	closed  bool

	// testHookHandshake, if set, runs inside readHandshake's read
	// transaction, holding its pooled connection.
	testHookHandshake func()
}

var (
	_ storage.Store         = (*Store)(nil)
	_ storage.SchemaEnsurer = (*Store)(nil)
	_ storage.WriteProber   = (*Store)(nil)
	_ storage.PoolSizer     = (*Store)(nil)
)

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

func (l *Store) ensureSchema(ctx context.Context) error {
	err := l.writeTx(ctx, func(conn *sql.Conn) error {
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
	if err := l.backfillOrdinals(ctx); err != nil {
		return fmt.Errorf("number the rows of an earlier version: %w", err)
	}
	return l.writeTx(ctx, func(conn *sql.Conn) error {
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
func (l *Store) backfillOrdinals(ctx context.Context) error {
	var (
		pending bool
		head    int64
	)
	err := l.db.QueryRowContext(ctx, qUnmigrated).Scan(&pending)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !pending) {
		return nil
	}
	if err != nil {
		return err
	}
	// Unnumbered rows are a suffix: find where it starts by bisection, so
	// that a numbering interrupted (New's deadline, a crash) resumes there.
	var after int64 // every row up to here is numbered
	if err := l.db.QueryRowContext(ctx, qHead).Scan(&head); err != nil {
		return err
	}
	for lo, hi := int64(0), head; lo < hi; {
		mid := lo + (hi-lo+1)/2
		var unnumbered bool
		err := l.db.QueryRowContext(ctx, qFirstFrom, mid).Scan(&unnumbered)
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
		err := l.writeTx(ctx, func(conn *sql.Conn) error {
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

func (l *Store) head(ctx context.Context, q querier) (int64, error) {
	var head int64
	err := q.QueryRowContext(ctx, qHead).Scan(&head)
	return head, err
}

// windowStart returns the sequence of the limit-th newest event of scope in
// (after, through], or 0 if there are fewer: the first event of a replay
// window. It reads only the index.
func (l *Store) windowStart(ctx context.Context, q querier, topics []string, after, through int64, limit int) (int64, error) {
	var seq int64
	err := q.QueryRowContext(ctx, scopeQuery(kindBoundary, len(topics)), scopeArgs(topics, after, through, limit)...).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return seq, err
}

// span counts the events of scope in (after, before) with two index
// lookups per branch (each topic, broadcasts; or the whole log): the first
// and the last row of the branch in the range, whose ordinals differ by one
// less than the rows between them. That is exact because the writer numbers
// each branch's rows 1, 2, 3, ... in sequence order, and rows are only ever
// deleted by retention, which deletes a prefix of the log: a branch's
// retained rows are a suffix of its rows, numbered without a hole, however
// much was pruned below them. (A log reset from outside starts the numbers
// again at 1 with the first new row, which keeps that true.) Rows not yet
// numbered, left by an earlier version of replayd writing the same file, are
// counted row by row instead.
func (l *Store) span(ctx context.Context, q querier, topics []string, after, before int64) (storage.Span, error) {
	var s storage.Span
	if before <= after+1 {
		return s, nil
	}
	rows, err := q.QueryContext(ctx, scopeQuery(kindOrdinals, len(topics)), scopeArgs(topics, after, before)...)
	if err != nil {
		return s, err
	}
	type ends struct{ first, last sql.NullInt64 }
	var (
		branch     = make([]ends, len(topics)+1)
		unnumbered bool
	)
	for rows.Next() {
		var (
			i, last int
			seq     int64
			ord     sql.NullInt64
		)
		if err := rows.Scan(&i, &last, &seq, &ord); err != nil {
			rows.Close()
			return s, err
		}
		unnumbered = unnumbered || !ord.Valid
		if last == 1 {
			branch[i].last = ord
			s.Last = max(s.Last, seq)
		} else {
			branch[i].first = ord
			if s.First == 0 || seq < s.First {
				s.First = seq
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return s, err
	}
	if unnumbered {
		err := q.QueryRowContext(ctx, scopeQuery(kindCount, len(topics)), scopeArgs(topics, after, before)...).Scan(&s.Count, &s.First, &s.Last)
		return s, err
	}
	for _, b := range branch {
		if b.first.Valid && b.last.Valid {
			s.Count += b.last.Int64 - b.first.Int64 + 1
		}
	}
	return s, nil
}

// watermark returns the highest prune watermark that applies to scope: its
// topics' and the broadcasts', or any topic's for the global scope.
func (l *Store) watermark(ctx context.Context, q querier, topics []string) (int64, error) {
	var p int64
	err := q.QueryRowContext(ctx, scopeQuery(kindWatermark, len(topics)), scopeArgs(topics)...).Scan(&p)
	return p, err
}

// readHandshake reads, in one read transaction, the head and, when cursor is
// below it, where the replay window of at most limit events above cursor
// starts, the skipped events below that window, and the prune watermark. A
// negative cursor means a fresh client: only the head is read. It reads
// index entries only, never a payload: the window itself is read page by
// page afterwards (see readPage).
func (l *Store) readHandshake(ctx context.Context, topics []string, cursor int64, limit int) (hs storage.Window, err error) {
	err = l.readTx(ctx, func(tx querier) error {
		hs, err = l.handshakeTx(ctx, tx, topics, cursor, limit)
		return err
	})
	return hs, err
}

func (l *Store) handshakeTx(ctx context.Context, tx querier, topics []string, cursor int64, limit int) (hs storage.Window, err error) {
	if cursor < 0 {
		hs.Head, err = l.head(ctx, tx)
		return hs, err
	}
	err = tx.QueryRowContext(ctx, qHeadForeign, cursor).Scan(&hs.Head, &hs.Foreign)
	if err != nil || cursor >= hs.Head || hs.Foreign {
		return hs, err
	}
	if l.testHookHandshake != nil {
		l.testHookHandshake()
	}
	hs.From = hs.Head + 1
	if limit > 0 {
		start, err := l.windowStart(ctx, tx, topics, cursor, hs.Head, limit)
		if err != nil {
			return hs, err
		}
		hs.From = cursor + 1 // fewer than limit events: all of them
		if start > 0 {
			hs.From = start
		}
	}
	if hs.Skipped, err = l.span(ctx, tx, topics, cursor, hs.From); err != nil {
		return hs, err
	}
	if hs.Watermark, err = l.watermark(ctx, tx, topics); err != nil {
		return hs, err
	}
	// Every event of the scope at or below the watermark is gone: W starts
	// above it (a window of fewer than limit events starts at cursor+1).
	hs.From = max(hs.From, hs.Watermark+1)
	return hs, nil
}

func scanEvent(row interface{ Scan(...any) error }) (storage.Event, error) {
	var (
		ev      storage.Event
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

// eventScanner scans events as scanEvent does, into destinations it
// reuses from row to row, so that a page's rows allocate only their values.
type eventScanner struct {
	ev      storage.Event
	topic   sql.NullString
	payload []byte
	created int64
	dest    []any
}

func (s *eventScanner) scan(rows *sql.Rows) (storage.Event, error) {
	if s.dest == nil {
		s.dest = []any{&s.ev.Sequence, &s.ev.EventID, &s.ev.Type, &s.topic, &s.payload, &s.created}
	}
	if err := rows.Scan(s.dest...); err != nil {
		return storage.Event{}, err
	}
	ev := s.ev
	ev.Topic = s.topic.String
	ev.Payload = json.RawMessage(s.payload)
	ev.CreatedAt = time.UnixMilli(s.created)
	s.payload = nil // the next row's payload is its own copy
	return ev, nil
}

// writeTx runs fn inside BEGIN IMMEDIATE on one pooled connection, so the
// write lock is taken up front and a busy database is waited for by the busy
// timeout instead of failing a deferred transaction's upgrade.
func (l *Store) writeTx(ctx context.Context, fn func(*sql.Conn) error) (err error) {
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
func (l *Store) prune(ctx context.Context, policy storage.RetentionPolicy, lock func() func()) (int64, error) {
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

func (l *Store) pruneOnce(ctx context.Context, countEdge, ageEdge int64, lock func() func()) (deleted int64, err error) {
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
