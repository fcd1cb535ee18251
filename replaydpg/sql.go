package replaydpg

import "strings"

const eventColumns = `e.sequence, e.event_id, e.type, e.topic, e.payload, e.created_at`

// qProbe is the first statement of ProbeWrite's pipeline (one implicit
// transaction, qLock after it). For that transaction only, it sets $1 as
// lock_timeout, and synchronous_commit off: the transaction writes nothing,
// it only holds the head row's lock until its commit, which then need not
// wait for a WAL flush. Its third column tells whether the server accepts
// writes.
const qProbe = `SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true),
	NOT pg_is_in_recovery() AND current_setting('default_transaction_read_only') = 'off'`

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

// Retention.
const (
	// qPruneEdges: $1 MaxEvents (0: none), $2 MaxAge in microseconds (0:
	// none). The count edge is the highest global ordinal that MaxEvents
	// condemns: ordinals are contiguous over the retained rows, so it is the
	// newest row's minus MaxEvents, one index probe however many rows are
	// kept. The age edge is taken from the server's clock, the one created_at
	// uses.
	qPruneEdges = `SELECT
		CASE WHEN $1::bigint > 0 THEN coalesce((SELECT global_ord FROM %[1]sevents ORDER BY sequence DESC LIMIT 1), 0) - $1 ELSE 0 END,
		CASE WHEN $2::bigint > 0 THEN clock_timestamp() - $2::bigint * interval '1 microsecond' ELSE '-infinity'::timestamptz END`

	// qPruneBatch deletes, among the first $4 rows above $1, the prefix
	// condemned by the count edge $2 (a global ordinal) or the age edge $3, and raises the
	// watermarks of their topics in the same statement (so the same
	// transaction). The condemned rows are a prefix because created_at never
	// decreases as the sequence grows. It returns the rows it deleted and the
	// end of the condemned prefix (NULL when nothing in the window is
	// condemned); another node's prune may have deleted some of them first.
	// Starting the scan at the last deleted sequence skips the dead index
	// entries a previous delete leaves until VACUUM.
	qPruneBatch = `WITH edge AS (
		SELECT max(b.sequence) AS through FROM (
			SELECT e.sequence, e.global_ord, e.created_at FROM %[1]sevents e WHERE e.sequence > $1 ORDER BY e.sequence LIMIT $4) b
		WHERE b.global_ord <= $2 OR b.created_at < $3
	), d AS (
		DELETE FROM %[1]sevents e USING edge WHERE e.sequence > $1 AND e.sequence <= edge.through
		RETURNING e.sequence, e.topic
	), w AS (
		INSERT INTO %[1]swatermarks (topic, sequence)
		SELECT coalesce(d.topic, ''), max(d.sequence) FROM d GROUP BY 1 ORDER BY 1
		ON CONFLICT (topic) DO UPDATE SET sequence = greatest(%[1]swatermarks.sequence, excluded.sequence)
	)
	SELECT (SELECT count(*) FROM d), (SELECT through FROM edge)`
)

// render substitutes the table prefix into a query.
func render(q, prefix string) string {
	return strings.ReplaceAll(q, "%[1]s", prefix)
}
