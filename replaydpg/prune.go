package replaydpg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/replayd/replayd/storage"
)

// pruneRows is how many rows one retention statement deletes at most.
const pruneRows = 1000

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

// Prune deletes the events policy condemns (all but the newest MaxEvents,
// and those created more than MaxAge ago by the server's clock, whichever
// deletes more), oldest first, in statements of at most 1,000 rows, each of
// which raises the prune watermark of every topic it deleted from (the empty topic for
// broadcasts) in the same transaction. Several nodes may prune at once;
// each counts only the rows it deleted. It returns how many rows it deleted.
func (s *Store) Prune(ctx context.Context, policy storage.RetentionPolicy) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return 0, nil
	}
	var (
		countEdge int64              // rows with a global ordinal up to this one exceed MaxEvents
		ageEdge   pgtype.Timestamptz // -infinity without MaxAge
	)
	err := s.pool.QueryRow(ctx, s.q.pruneEdges, max(policy.MaxEvents, 0), max(policy.MaxAge.Microseconds(), 0)).
		Scan(&countEdge, &ageEdge)
	if err != nil {
		return 0, fmt.Errorf("replaydpg: prune: %w", err)
	}
	// Everything at or below the highest watermark is deleted already: start
	// the scan there, past the dead index entries.
	last, err := s.highestWatermark(ctx)
	if err != nil {
		return 0, err
	}
	var deleted int64
	for {
		var (
			n       int64
			through *int64
		)
		if err := s.pool.QueryRow(ctx, s.q.pruneBatch, last, countEdge, ageEdge, pruneRows).Scan(&n, &through); err != nil {
			return deleted, fmt.Errorf("replaydpg: prune: %w", err)
		}
		deleted += n
		if through == nil {
			return deleted, nil
		}
		last = *through
	}
}

// highestWatermark returns the highest prune watermark of any topic: the
// highest sequence retention has deleted (0: none).
func (s *Store) highestWatermark(ctx context.Context) (int64, error) {
	var w int64
	if err := s.pool.QueryRow(ctx, s.q.watermark, []string{}).Scan(&w); err != nil {
		return 0, fmt.Errorf("replaydpg: watermark: %w", err)
	}
	return w, nil
}
