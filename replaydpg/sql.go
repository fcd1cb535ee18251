package replaydpg

import "strings"

// qProbe is the first statement of ProbeWrite's pipeline (one implicit
// transaction, qLock after it). For that transaction only, it sets $1 as
// lock_timeout, and synchronous_commit off: the transaction writes nothing,
// it only holds the head row's lock until its commit, which then need not
// wait for a WAL flush. Its third column tells whether the server accepts
// writes.
const qProbe = `SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true),
	NOT pg_is_in_recovery() AND current_setting('default_transaction_read_only') = 'off'`

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
