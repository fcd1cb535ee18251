package replaydpg

// The reads: Head, Read, Window and Count, each one snapshot in one round
// trip (scopeSnapshot, snapshot, readBatch), and the statements they run.

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd/storage"
)

const eventColumns = `e.sequence, e.event_id, e.type, e.topic, e.payload, e.created_at`

// Reads.
const (
	qHead = `SELECT seq FROM %[1]shead WHERE id = 1`

	// qHeadForeign: the head, and whether the cursor $1 is foreign to the
	// log: above the head, or strictly inside a skipped range. Ranges never
	// overlap and end at or below the head, so only the one starting
	// nearest below the cursor can hold it: one index probe. A range
	// ending above the head (the head reset from outside) is ignored.
	// The probe is a LATERAL, not a scalar subquery under BETWEEN, which
	// the planner expands into two comparisons and runs twice.
	qHeadForeign = `SELECT h.seq, $1::bigint > h.seq OR coalesce(k.through > $1::bigint AND k.through <= h.seq, false)
		FROM %[1]shead h LEFT JOIN LATERAL (SELECT s.through FROM %[1]sskips s
			WHERE s.after < $1::bigint ORDER BY s.after DESC LIMIT 1) k ON true
		WHERE h.id = 1`

	// qWatermark: $1 the scope's topics; empty is the global scope (any
	// topic's watermark), otherwise those topics' and the broadcasts'.
	qWatermark = `SELECT coalesce(max(sequence), 0) FROM %[1]swatermarks
		WHERE coalesce(cardinality($1::text[]), 0) = 0 OR topic = '' OR topic = ANY($1::text[])`

	// Scope reads: $1 topics, $2 cursor, $3 limit (the global forms: $1
	// cursor, $2 limit). A topic scope is one index range scan per topic
	// (LATERAL) and one for the broadcasts, each limited, then a sort of at
	// most (topics+1)*limit rows. An OR, or a UNION ALL with only an outer
	// limit, bitmap-scans everything above the cursor and sorts it;
	// TestQueryPlans pins this.
	// The same, sequences only (Window reads no payload).
	qNewestSeqGlobal = `SELECT e.sequence FROM %[1]sevents e
		WHERE e.sequence > $1 ORDER BY e.sequence DESC LIMIT $2`
	qNewestSeqTopics = `SELECT s.* FROM (
		SELECT x.* FROM unnest($1::text[]) AS t(topic) CROSS JOIN LATERAL (
			SELECT e.sequence FROM %[1]sevents e
			WHERE (e.topic, e.sequence) > (t.topic, $2) AND (e.topic, e.sequence) <= (t.topic, 9223372036854775807)
			ORDER BY e.topic DESC, e.sequence DESC LIMIT $3) x
		UNION ALL
		(SELECT e.sequence FROM %[1]sevents e
			WHERE e.topic IS NULL AND e.sequence > $2 ORDER BY e.topic DESC, e.sequence DESC LIMIT $3)
	) s ORDER BY s.sequence DESC LIMIT $3`
	qOldestGlobal = `SELECT ` + eventColumns + ` FROM %[1]sevents e
		WHERE e.sequence > $1 ORDER BY e.sequence LIMIT $2`
	qOldestTopics = `SELECT s.* FROM (
		SELECT x.* FROM unnest($1::text[]) AS t(topic) CROSS JOIN LATERAL (
			SELECT ` + eventColumns + ` FROM %[1]sevents e
			WHERE (e.topic, e.sequence) > (t.topic, $2) AND (e.topic, e.sequence) <= (t.topic, 9223372036854775807)
			ORDER BY e.topic, e.sequence LIMIT $3) x
		UNION ALL
		(SELECT ` + eventColumns + ` FROM %[1]sevents e
			WHERE e.topic IS NULL AND e.sequence > $2 ORDER BY e.topic, e.sequence LIMIT $3)
	) s ORDER BY s.sequence LIMIT $3`

	// Pages (Read, with a MaxBytes): the oldest events of the scope in
	// ($after, $through], at most $limit, stopping once they hold
	// $maxBytes of payload (at least one), then at most one row more with
	// keep false and no payload: the next event of the scope in ($after,
	// $through] (it tells More).
	//
	// The inner query is the oldest read above (same plan), limited to
	// $limit+1 rows, with octet_length(payload) beside the payload:
	// octet_length of a text reads the stored value's header (its raw
	// size), neither fetching an out-of-line (TOAST) value nor
	// decompressing it, and the payload column stays a pointer to the
	// out-of-line value until a row is sent. Rows above $through are
	// dropped after the limit, not bounded in the index scan: a range
	// bounded on both sides by parameters is estimated at 0.5% of the
	// table, and the planner then bitmap-scans everything above the cursor
	// and sorts it (seen on 4,000 rows without statistics; TestQueryPlans).
	// One window over the rows in sequence order numbers them (n) and sums
	// the sizes before each (before); a row is kept if it is the first, or
	// within the limit with less than $maxBytes before it, and shown if it
	// is kept or its predecessor was (prev: the predecessor's size). Only
	// kept rows carry their payload, so the server never reads, nor sends,
	// a payload the page leaves out (paging through large events used to
	// move each one up to $limit+1 times: git show 60f0bd1:BENCHMARKS.md, "Issue 11:
	// PostgreSQL", "Reads cut at MaxBytes on the server"). The bytes are
	// counted in the database's encoding, which is the payload's own
	// (UTF-8) in a UTF8 or SQL_ASCII database.
	//
	// $1 topics, $2 after, $3 through, $4 limit, $5 maxBytes (the global
	// form: $1 after, $2 through, $3 limit, $4 maxBytes).
	qPageGlobal = `SELECT p.sequence, p.event_id, p.type, p.topic, CASE WHEN p.keep THEN p.payload END, p.created_at, p.keep FROM (
		SELECT w.*, w.n <= $3::bigint AND (w.n = 1 OR w.before < $4::bigint) AS keep,
			w.n = 1 OR (w.n - 1 <= $3::bigint AND (w.n = 2 OR w.before - w.prev < $4::bigint)) AS shown
		FROM (SELECT c.*, row_number() OVER w AS n, sum(c.size) OVER w - c.size AS before, lag(c.size) OVER w AS prev
			FROM (SELECT ` + eventColumns + `, octet_length(e.payload) AS size FROM %[1]sevents e
				WHERE e.sequence > $1 ORDER BY e.sequence LIMIT $3::bigint + 1) c
			WHERE c.sequence <= $2::bigint
			WINDOW w AS (ORDER BY c.sequence ROWS UNBOUNDED PRECEDING)) w
	) p WHERE p.shown ORDER BY p.sequence`
	qPageTopics = `SELECT p.sequence, p.event_id, p.type, p.topic, CASE WHEN p.keep THEN p.payload END, p.created_at, p.keep FROM (
		SELECT w.*, w.n <= $4::bigint AND (w.n = 1 OR w.before < $5::bigint) AS keep,
			w.n = 1 OR (w.n - 1 <= $4::bigint AND (w.n = 2 OR w.before - w.prev < $5::bigint)) AS shown
		FROM (SELECT c.*, row_number() OVER w AS n, sum(c.size) OVER w - c.size AS before, lag(c.size) OVER w AS prev
			FROM (SELECT s.* FROM (
				SELECT x.* FROM unnest($1::text[]) AS t(topic) CROSS JOIN LATERAL (
					SELECT ` + eventColumns + `, octet_length(e.payload) AS size FROM %[1]sevents e
					WHERE (e.topic, e.sequence) > (t.topic, $2) AND (e.topic, e.sequence) <= (t.topic, 9223372036854775807)
					ORDER BY e.topic, e.sequence LIMIT $4::bigint + 1) x
				UNION ALL
				(SELECT ` + eventColumns + `, octet_length(e.payload) AS size FROM %[1]sevents e
					WHERE e.topic IS NULL AND e.sequence > $2 ORDER BY e.topic, e.sequence LIMIT $4::bigint + 1)
			) s ORDER BY s.sequence LIMIT $4::bigint + 1) c
			WHERE c.sequence <= $3::bigint
			WINDOW w AS (ORDER BY c.sequence ROWS UNBOUNDED PRECEDING)) w
	) p WHERE p.shown ORDER BY p.sequence`

	// Counting: the number and the first sequence of the visible rows above
	// $2. Per group, the first row above the cursor and the group's last row
	// are each one index probe; the count is the difference of their
	// ordinals plus one. $1 topics.
	qCountGlobal = `SELECT coalesce(sum(l.global_ord - f.global_ord + 1), 0), coalesce(min(f.sequence), 0)
		FROM (SELECT e.sequence, e.global_ord FROM %[1]sevents e WHERE e.sequence > $1 ORDER BY e.sequence LIMIT 1) f,
			(SELECT e.global_ord FROM %[1]sevents e ORDER BY e.sequence DESC LIMIT 1) l`
	qCountTopics = `SELECT coalesce(sum(s.last - s.topic_ord + 1), 0), coalesce(min(s.sequence), 0) FROM (
		SELECT f.sequence, f.topic_ord,
			(SELECT e.topic_ord FROM %[1]sevents e WHERE (e.topic, e.sequence) > (t.topic, 0) AND (e.topic, e.sequence) <= (t.topic, 9223372036854775807)
				ORDER BY e.topic DESC, e.sequence DESC LIMIT 1) AS last
		FROM unnest($1::text[]) AS t(topic) CROSS JOIN LATERAL (
			SELECT e.sequence, e.topic_ord FROM %[1]sevents e
			WHERE (e.topic, e.sequence) > (t.topic, $2) AND (e.topic, e.sequence) <= (t.topic, 9223372036854775807)
			ORDER BY e.topic, e.sequence LIMIT 1) f
		UNION ALL
		SELECT f.sequence, f.topic_ord,
			(SELECT e.topic_ord FROM %[1]sevents e WHERE e.topic IS NULL ORDER BY e.topic DESC, e.sequence DESC LIMIT 1)
		FROM (SELECT e.sequence, e.topic_ord FROM %[1]sevents e
			WHERE e.topic IS NULL AND e.sequence > $2 ORDER BY e.topic, e.sequence LIMIT 1) f
	) s`

	qBeginSnapshot = `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`
)

// Head returns the highest sequence ever assigned; it never goes backwards,
// whatever retention deletes.
func (s *Store) Head(ctx context.Context) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	var head int64
	if err := s.pool.QueryRow(ctx, s.q.head).Scan(&head); err != nil {
		return 0, fmt.Errorf("replaydpg: head: %w", err)
	}
	s.saw(head)
	return head, nil
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
	// The global scope's ordinals have holes below the hole mark (topics
	// pruned apart, prune.go): there the rows are counted one by one, and
	// by ordinals above it.
	count, args := s.q.prune.countGlobalAbove, []any{}
	if len(topics) > 0 {
		count, args = s.q.countTopics, []any{topics}
	}
	b := &pgx.Batch{}
	b.Queue(qBeginSnapshot)
	b.Queue(count, append(args, after)...)
	b.Queue(count, append(args, before-1)...)
	if len(topics) == 0 {
		b.Queue(s.q.prune.countBelowHole, after, before)
	}
	b.Queue("COMMIT")
	var above, atOrAbove, below, first int64
	err = s.snapshot(ctx, b, func(br pgx.BatchResults) error {
		if err := br.QueryRow().Scan(&above, &first); err != nil {
			return err
		}
		if err := br.QueryRow().Scan(&atOrAbove, &first); err != nil {
			return err
		}
		if len(topics) == 0 {
			return br.QueryRow().Scan(&below)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("replaydpg: count: %w", err)
	}
	return above - atOrAbove + below, nil
}

func defaultLimit(limit int) int {
	if limit <= 0 {
		return 100
	}
	return limit
}

// scopeTopics returns topics sorted without repeats; empty is the global
// scope. An empty string in a non-empty list is refused: broadcasts are in
// every scope already, and "" alone would silently widen it to global.
func scopeTopics(topics []string) ([]string, error) {
	out := slices.Clone(topics)
	slices.Sort(out)
	out = slices.Compact(out)
	for _, t := range out {
		if t == "" {
			return nil, fmt.Errorf("replaydpg: %w: empty topic in a scope", storage.ErrInvalid)
		}
	}
	return out, nil
}

// scopeSnapshot reads, in one REPEATABLE READ READ ONLY transaction and
// one round trip, the head into head, whether cursor is foreign to the log
// into foreign (see the sequence floor, Open) and the scope's prune
// watermark into mark, then the statements queue adds, whose results read
// reads.
func (s *Store) scopeSnapshot(ctx context.Context, topics []string, cursor int64, head *int64, foreign *bool, mark *int64, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	b := &pgx.Batch{}
	b.Queue(qBeginSnapshot)
	b.Queue(s.q.headForeign, cursor)
	b.Queue(s.q.watermark, topics)
	queue(b)
	b.Queue("COMMIT")
	return s.snapshot(ctx, b, func(br pgx.BatchResults) error {
		if err := br.QueryRow().Scan(head, foreign); err != nil {
			return err
		}
		s.saw(*head)
		if err := br.QueryRow().Scan(mark); err != nil {
			return err
		}
		return read(br)
	})
}

// snapshot sends b, which must open a transaction first and COMMIT last,
// reads its results with read, and closes it.
func (s *Store) snapshot(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	return readBatch(s.pool.SendBatch(ctx, b), 1, read)
}

// readBatch reads the results of a batch sent as lead statements, those
// read reads, and a COMMIT, and closes it: the first error wins.
func readBatch(br pgx.BatchResults, lead int, read func(pgx.BatchResults) error) error {
	err := func() error {
		for range lead {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := read(br); err != nil {
			return err
		}
		_, err := br.Exec()
		return err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}
