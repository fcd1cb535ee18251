package replaydpg

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/replayd/replayd/internal/prunepace"
	"github.com/replayd/replayd/storage"
)

// pruneRows is how many rows one retention statement deletes at most.
const pruneRows = 1000

// pruneDuty: while this store appends, a per-topic prune works at most
// 1/pruneDuty of the time (package prunepace); measured with 10
// (BENCHMARKS.md "Retention per topic").
const pruneDuty = 10

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
// broadcasts) in the same transaction. With policy.Topics each topic is
// pruned by the first entry that matches it, and the rest by the default
// (prunePerTopic): a prefix of each topic. Several nodes may prune at once;
// each counts only the rows it deleted. It returns how many rows it deleted.
func (s *Store) Prune(ctx context.Context, policy storage.RetentionPolicy) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if err := policy.Validate(); err != nil {
		return 0, err
	}
	if len(policy.Topics) > 0 {
		return s.prunePerTopic(ctx, policy)
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
	// Everything at or below the highest watermark is deleted already,
	// unless topics were pruned apart (the hole mark): start the scan
	// there, past the dead index entries. Once they were, the global
	// ordinals have holes, and the count edge is found by walking the
	// newest rows instead.
	var hole int64
	if err := s.pool.QueryRow(ctx, s.q.prune.holeMark).Scan(&hole); err != nil {
		return 0, fmt.Errorf("replaydpg: prune: %w", err)
	}
	var last int64
	if hole == 0 {
		if last, err = s.highestWatermark(ctx); err != nil {
			return 0, err
		}
	} else if policy.MaxEvents > 0 {
		if err := s.pool.QueryRow(ctx, s.q.prune.countEdgeScan, policy.MaxEvents).Scan(&countEdge); err != nil {
			return 0, fmt.Errorf("replaydpg: prune: %w", err)
		}
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

// holeKey is the row of the watermarks table, under a key no topic can be
// (topics hold no control character), recording the highest sequence
// deleted out of the log's order: by a per-topic policy, by the default
// beside them, or by PruneTopic. Below it global_ord has holes, so the
// whole-log count edge and Count of the global scope do not trust it there.
// It is a deleted row's sequence, never above the global watermark (the
// table's highest), which it leaves as it is.
const holeKey = "\x01"

// Per-topic retention. $1 is the topic (the broadcasts' forms ignore it).
const (
	// qPruneTopics lists the topics that have rows (not broadcasts), one
	// index probe each, skipping from one to the next.
	qPruneTopics = `WITH RECURSIVE t(x) AS (
		SELECT (SELECT min(e.topic) FROM %[1]sevents e)
		UNION ALL
		SELECT (SELECT min(e.topic) FROM %[1]sevents e WHERE e.topic > t.x) FROM t WHERE t.x IS NOT NULL)
	SELECT x FROM t WHERE x IS NOT NULL`
	// qPruneTopicOrdEdge: the topic's newest topic_ord minus $2 (its rows
	// up to that ordinal exceed MaxEvents $2; ordinals are contiguous over
	// a topic's retained rows, which only ever lose a prefix).
	qPruneTopicOrdEdge = `SELECT coalesce((SELECT e.topic_ord FROM %[1]sevents e
		WHERE (e.topic, e.sequence) > ($1::text, 0) AND (e.topic, e.sequence) <= ($1::text, 9223372036854775807)
		ORDER BY e.topic DESC, e.sequence DESC LIMIT 1), 0) - $2::bigint`
	// qPruneTopicBatch deletes, among the first $4 rows of the topic above
	// $7, the prefix condemned by the ordinal edge $2, the sequence edge $5
	// or the age edge $3, never above the head $6, and raises the topic's
	// watermark and the hole mark in the same statement. It returns the
	// rows deleted and the end of the condemned prefix (NULL: none).
	qPruneTopicBatch = `WITH b AS (
		SELECT e.sequence, e.topic_ord, e.created_at FROM %[1]sevents e
		WHERE (e.topic, e.sequence) > ($1::text, $7::bigint) AND (e.topic, e.sequence) <= ($1::text, 9223372036854775807)
		ORDER BY e.topic, e.sequence LIMIT $4
	)` + pruneEdgeCTE + `, d AS (
		DELETE FROM %[1]sevents e USING edge
		WHERE (e.topic, e.sequence) > ($1::text, $7::bigint) AND (e.topic, e.sequence) <= ($1::text, edge.through)
		RETURNING e.sequence
	)` + pruneTopicTail
	qPruneBcastBatch = `WITH b AS (
		SELECT e.sequence, e.topic_ord, e.created_at FROM %[1]sevents e
		WHERE e.topic IS NULL AND e.sequence > $7::bigint AND $1::text IS NULL
		ORDER BY e.topic, e.sequence LIMIT $4
	)` + pruneEdgeCTE + `, d AS (
		DELETE FROM %[1]sevents e USING edge
		WHERE e.topic IS NULL AND e.sequence > $7::bigint AND e.sequence <= edge.through
		RETURNING e.sequence
	)` + pruneTopicTail
	pruneEdgeCTE = `, edge AS (
		SELECT max(b.sequence) AS through FROM b
		WHERE b.sequence <= $6::bigint AND (b.topic_ord <= $2::bigint OR b.sequence <= $5::bigint OR b.created_at < $3)
	)`
	pruneTopicTail = `, w AS (
		INSERT INTO %[1]swatermarks (topic, sequence)
		SELECT k.topic, edge.through FROM edge, (VALUES (coalesce($1::text, '')), ('` + holeKey + `')) AS k(topic)
		WHERE edge.through IS NOT NULL
		ORDER BY 1
		ON CONFLICT (topic) DO UPDATE SET sequence = greatest(%[1]swatermarks.sequence, excluded.sequence)
	)
	SELECT (SELECT count(*) FROM d), (SELECT through FROM edge)`
	// qPruneRestNewest walks the log from the head $1 down, for the
	// default's count edge beside per-topic policies.
	qPruneRestNewest = `SELECT e.sequence, e.topic FROM %[1]sevents e WHERE e.sequence <= $1 ORDER BY e.sequence DESC`
	// qPruneCountEdgeScan: the global_ord of the ($1+1)-th newest row, or
	// 0: the whole-log count edge once global_ord has holes.
	qPruneCountEdgeScan = `SELECT coalesce((SELECT e.global_ord FROM %[1]sevents e ORDER BY e.sequence DESC LIMIT 1 OFFSET $1), 0)`
	qHoleMark           = `SELECT coalesce((SELECT sequence FROM %[1]swatermarks WHERE topic = '` + holeKey + `'), 0)`
	// qCountBelowHole counts the rows in ($1, $2) at or below the hole
	// mark one by one; qCountGlobalAbove is qCountGlobal above
	// greatest($1, the hole mark), where global_ord has no holes.
	qCountBelowHole = `SELECT count(*) FROM %[1]sevents e
		WHERE e.sequence > $1::bigint AND e.sequence < least($2::bigint, (` + qHoleMark + `) + 1)`
	qCountGlobalAbove = `SELECT coalesce(sum(l.global_ord - f.global_ord + 1), 0), coalesce(min(f.sequence), 0)
		FROM (SELECT e.sequence, e.global_ord FROM %[1]sevents e WHERE e.sequence > greatest($1::bigint, (` + qHoleMark + `)) ORDER BY e.sequence LIMIT 1) f,
			(SELECT e.global_ord FROM %[1]sevents e ORDER BY e.sequence DESC LIMIT 1) l`
)

// topicPruneQueries are per-topic retention's statements, rendered for
// the table prefix.
type topicPruneQueries struct {
	topics, ordEdge, topicBatch, bcastBatch, restNewest, countEdgeScan, holeMark string
	countBelowHole, countGlobalAbove                                             string
}

func newTopicPruneQueries(p string) topicPruneQueries {
	return topicPruneQueries{
		topics: render(qPruneTopics, p), ordEdge: render(qPruneTopicOrdEdge, p),
		topicBatch: render(qPruneTopicBatch, p), bcastBatch: render(qPruneBcastBatch, p),
		restNewest: render(qPruneRestNewest, p), countEdgeScan: render(qPruneCountEdgeScan, p),
		holeMark: render(qHoleMark, p), countBelowHole: render(qCountBelowHole, p),
		countGlobalAbove: render(qCountGlobalAbove, p),
	}
}

// ageEdge returns the server's clock less maxAge (-infinity: no limit).
func (s *Store) ageEdge(ctx context.Context, maxAge time.Duration) (pgtype.Timestamptz, error) {
	var countEdge int64
	var edge pgtype.Timestamptz
	err := s.pool.QueryRow(ctx, s.q.pruneEdges, 0, max(maxAge.Microseconds(), 0)).Scan(&countEdge, &edge)
	return edge, err
}

// prunePerTopic applies a policy with Topics: each topic with rows is
// pruned by the entry that governs it, or by the default, whose MaxEvents
// counts the broadcasts' and the ungoverned topics' rows together. Every
// deletion is a prefix of one topic. Nothing above the head read first is
// condemned: the topics listed after it include those of every row at or
// below it.
func (s *Store) prunePerTopic(ctx context.Context, policy storage.RetentionPolicy) (int64, error) {
	h0, err := s.Head(ctx)
	if err != nil {
		return 0, err
	}
	rows, err := s.pool.Query(ctx, s.q.prune.topics)
	if err != nil {
		return 0, fmt.Errorf("replaydpg: prune: %w", err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("replaydpg: prune: %w", err)
	}
	var (
		deleted  int64
		rest     []*string
		governed = map[string]bool{}
	)
	for _, t := range topics {
		tp, ok := policy.For(t)
		if !ok {
			rest = append(rest, &t)
			continue
		}
		governed[t] = true
		if tp.MaxEvents <= 0 && tp.MaxAge <= 0 {
			continue
		}
		var ordEdge int64
		if tp.MaxEvents > 0 {
			if err := s.pool.QueryRow(ctx, s.q.prune.ordEdge, t, tp.MaxEvents).Scan(&ordEdge); err != nil {
				return deleted, fmt.Errorf("replaydpg: prune: %w", err)
			}
		}
		age, err := s.ageEdge(ctx, tp.MaxAge)
		if err != nil {
			return deleted, fmt.Errorf("replaydpg: prune: %w", err)
		}
		n, err := s.pruneTopicThrough(ctx, &t, ordEdge, 0, age, h0)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return deleted, nil
	}
	var seqEdge int64 // the default's rows at or below it exceed MaxEvents
	if policy.MaxEvents > 0 {
		if seqEdge, err = s.restCountEdge(ctx, policy.MaxEvents, h0, governed); err != nil {
			return deleted, fmt.Errorf("replaydpg: prune: %w", err)
		}
	}
	age, err := s.ageEdge(ctx, policy.MaxAge)
	if err != nil {
		return deleted, fmt.Errorf("replaydpg: prune: %w", err)
	}
	for _, t := range append(rest, nil) {
		n, err := s.pruneTopicThrough(ctx, t, 0, seqEdge, age, h0)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// restCountEdge returns the sequence of the (maxEvents+1)-th newest row at
// or below h0 that no entry governs, or 0.
func (s *Store) restCountEdge(ctx context.Context, maxEvents, h0 int64, governed map[string]bool) (int64, error) {
	rows, err := s.pool.Query(ctx, s.q.prune.restNewest, h0)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		var (
			seq   int64
			topic *string
		)
		if err := rows.Scan(&seq, &topic); err != nil {
			return 0, err
		}
		if topic != nil && governed[*topic] {
			continue
		}
		if n++; n > maxEvents {
			return seq, nil
		}
	}
	return 0, rows.Err()
}

// PruneTopic deletes every event of topic at or below through (see
// storage.TopicPruner), in statements of at most 1,000 rows.
func (s *Store) PruneTopic(ctx context.Context, topic string, through int64) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if topic == "" {
		return 0, fmt.Errorf("replaydpg: %w: PruneTopic of the broadcasts", storage.ErrInvalid)
	}
	h0, err := s.Head(ctx)
	if err != nil {
		return 0, err
	}
	return s.pruneTopicThrough(ctx, &topic, 0, min(through, h0), pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, h0)
}

// pruneTopicThrough deletes the rows of topic (nil: the broadcasts) with a
// topic_ord at or below ordEdge, a sequence at or below seqEdge, or created
// before age, never above h0: a prefix of the topic, in statements of at
// most pruneRows rows, each raising the topic's watermark and the hole mark,
// paced while this store appends (package prunepace: PostgreSQL's deletes
// take no lock an append waits for, but the server's CPU and I/O).
func (s *Store) pruneTopicThrough(ctx context.Context, topic *string, ordEdge, seqEdge int64, age pgtype.Timestamptz, h0 int64) (int64, error) {
	q := s.q.prune.topicBatch
	if topic == nil {
		q = s.q.prune.bcastBatch
	}
	var deleted, last int64
	pace := prunepace.New(s.issued.Load, pruneDuty)
	for {
		var (
			n       int64
			through *int64
		)
		pace.Start()
		if err := s.pool.QueryRow(ctx, q, topic, ordEdge, age, pruneRows, seqEdge, h0, last).Scan(&n, &through); err != nil {
			return deleted, fmt.Errorf("replaydpg: prune: %w", err)
		}
		deleted += n
		if through == nil {
			return deleted, nil
		}
		last = *through
		if err := pace.Pause(ctx); err != nil {
			return deleted, err
		}
	}
}
