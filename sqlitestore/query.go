package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/replayd/replayd/storage"
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

// querier is what both *sql.DB and *sql.Tx offer for reads.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *Store) head(ctx context.Context, q querier) (int64, error) {
	var head int64
	err := q.QueryRowContext(ctx, qHead).Scan(&head)
	return head, err
}

// windowStart returns the sequence of the limit-th newest event of scope in
// (after, through], or 0 if there are fewer: the first event of a replay
// window. It reads only the index.
func (s *Store) windowStart(ctx context.Context, q querier, topics []string, after, through int64, limit int) (int64, error) {
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
// deleted by retention, which deletes a prefix of each topic (of the log,
// without per-topic policies): a topic's or the broadcasts' retained rows
// are a suffix of its rows, numbered without a hole, however much was
// pruned below them. The global scope's ordinals have holes below the hole
// mark once topics were pruned apart (see holeKey): there span may count
// deleted rows, which Window allows (see storage.Window) and exactSpan,
// Count's, does not. (A log reset from outside starts the numbers
// again at 1 with the first new row, which keeps that true.) Rows not yet
// numbered, left by an earlier version of replayd writing the same file, are
// counted row by row instead.
func (s *Store) span(ctx context.Context, q querier, topics []string, after, before int64) (storage.Span, error) {
	var sp storage.Span
	if before <= after+1 {
		return sp, nil
	}
	rows, err := q.QueryContext(ctx, scopeQuery(kindOrdinals, len(topics)), scopeArgs(topics, after, before)...)
	if err != nil {
		return sp, err
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
			return sp, err
		}
		unnumbered = unnumbered || !ord.Valid
		if last == 1 {
			branch[i].last = ord
			sp.Last = max(sp.Last, seq)
		} else {
			branch[i].first = ord
			if sp.First == 0 || seq < sp.First {
				sp.First = seq
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return sp, err
	}
	if unnumbered {
		err := q.QueryRowContext(ctx, scopeQuery(kindCount, len(topics)), scopeArgs(topics, after, before)...).Scan(&sp.Count, &sp.First, &sp.Last)
		return sp, err
	}
	for _, b := range branch {
		if b.first.Valid && b.last.Valid {
			sp.Count += b.last.Int64 - b.first.Int64 + 1
		}
	}
	return sp, nil
}

// exactSpan is span, exact for the global scope too when per-topic
// retention left holes in the global ordinals: below the hole mark (see
// holeKey) it counts the rows one by one, above it by ordinals. Topics'
// and broadcasts' ordinals never have holes (each loses only a prefix).
// Window needs no exact count there (the scope's watermark is then above
// the cursor: a pruned gap, which counts nothing), so only Count pays it.
func (s *Store) exactSpan(ctx context.Context, q querier, topics []string, after, before int64) (storage.Span, error) {
	if len(topics) > 0 || before <= after+1 {
		return s.span(ctx, q, topics, after, before)
	}
	var hole int64
	if err := q.QueryRowContext(ctx, qHoleMark).Scan(&hole); err != nil {
		return storage.Span{}, err
	}
	if after >= hole {
		return s.span(ctx, q, topics, after, before)
	}
	var low storage.Span
	if err := q.QueryRowContext(ctx, scopeQuery(kindCount, 0), after, min(before, hole+1)).Scan(&low.Count, &low.First, &low.Last); err != nil {
		return low, err
	}
	if before <= hole+1 {
		return low, nil
	}
	high, err := s.span(ctx, q, topics, hole, before)
	if err != nil || low.Count == 0 {
		return high, err
	}
	if high.Count > 0 {
		low.Count += high.Count
		low.Last = high.Last
	}
	return low, nil
}

// watermark returns the highest prune watermark that applies to scope: its
// topics' and the broadcasts', or any topic's for the global scope.
func (s *Store) watermark(ctx context.Context, q querier, topics []string) (int64, error) {
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
func (s *Store) readHandshake(ctx context.Context, topics []string, cursor int64, limit int) (hs storage.Window, err error) {
	err = s.readTx(ctx, func(tx querier) error {
		hs, err = s.handshakeTx(ctx, tx, topics, cursor, limit)
		return err
	})
	return hs, err
}

func (s *Store) handshakeTx(ctx context.Context, tx querier, topics []string, cursor int64, limit int) (hs storage.Window, err error) {
	if cursor < 0 {
		hs.Head, err = s.head(ctx, tx)
		return hs, err
	}
	err = tx.QueryRowContext(ctx, qHeadForeign, cursor).Scan(&hs.Head, &hs.Foreign)
	if err != nil || cursor >= hs.Head || hs.Foreign {
		return hs, err
	}
	if s.testHookHandshake != nil {
		s.testHookHandshake()
	}
	hs.From = hs.Head + 1
	if limit > 0 {
		start, err := s.windowStart(ctx, tx, topics, cursor, hs.Head, limit)
		if err != nil {
			return hs, err
		}
		hs.From = cursor + 1 // fewer than limit events: all of them
		if start > 0 {
			hs.From = start
		}
	}
	if hs.Skipped, err = s.span(ctx, tx, topics, cursor, hs.From); err != nil {
		return hs, err
	}
	if hs.Watermark, err = s.watermark(ctx, tx, topics); err != nil {
		return hs, err
	}
	// The window may start at or below the watermark: events of topics
	// pruned less are retained there, and are replayed after the pruned
	// gap that names the range (see storage.Store, Retention and
	// watermarks).
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
