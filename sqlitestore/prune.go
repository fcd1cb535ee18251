package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"time"

	"github.com/replayd/replayd/storage"
)

// pruneBatch is how many rows one retention transaction deletes at most, so
// a large prune holds the write lock for milliseconds at a time.
const pruneBatch = 1000

// holeKey is the row of events_prune_watermarks, under a key no topic can
// be (topics hold no control character), that records the highest
// sequence deleted out of the log's order: by a per-topic policy, by the
// default beside per-topic policies, or by PruneTopic. Below it the global
// ordinals have holes, so the global scope's span counts row by row there
// (see span). It is a deleted row's sequence, never above the global
// watermark (the highest of the table), which it therefore leaves as it is.
const holeKey = "\x01"

// Per-topic retention.
const (
	// qPruneTopics lists the topics that have rows (not broadcasts), one
	// index probe each, by skipping from one to the next.
	qPruneTopics = `WITH RECURSIVE t(x) AS (
		SELECT (SELECT min(topic) FROM events)
		UNION ALL
		SELECT (SELECT min(topic) FROM events WHERE topic > t.x) FROM t WHERE t.x IS NOT NULL)
	SELECT x FROM t WHERE x IS NOT NULL`
	// qPruneTopicEdge: the sequence of the topic's (?2+1)-th newest row, or 0.
	qPruneTopicEdge     = `SELECT coalesce((SELECT sequence FROM events WHERE topic = ?1 ORDER BY sequence DESC LIMIT 1 OFFSET ?2), 0)`
	qPruneTopicHead     = `SELECT sequence, created_at FROM events WHERE topic = ?1 ORDER BY sequence LIMIT ?2`
	qPruneBroadcastHead = `SELECT sequence, created_at FROM events WHERE topic IS NULL AND ?1 IS NULL ORDER BY sequence LIMIT ?2`
	qPruneTopicDelete   = `DELETE FROM events WHERE topic = ?1 AND sequence <= ?2`
	qPruneBcastDelete   = `DELETE FROM events WHERE topic IS NULL AND ?1 IS NULL AND sequence <= ?2`
	// qPruneRestNewest walks the log from the newest row down, for the
	// default's count edge beside per-topic policies.
	qPruneRestNewest = `SELECT sequence, topic FROM events WHERE sequence <= ? ORDER BY sequence DESC`
	// qHoleMark: the hole mark (see holeKey), 0 when none.
	qHoleMark = `SELECT coalesce((SELECT sequence FROM events_prune_watermarks WHERE topic = '` + holeKey + `'), 0)`
)

// prune deletes the rows policy condemns, in batches of pruneBatch,
// recording each topic's prune watermark in the same transaction as the
// delete. It returns how many rows it deleted. Without per-topic policies
// it deletes a prefix of the log; with them, a prefix of each topic (see
// prunePerTopic).
func (s *Store) prune(ctx context.Context, policy storage.RetentionPolicy, lock func() func()) (int64, error) {
	if err := policy.Validate(); err != nil {
		return 0, err
	}
	if len(policy.Topics) > 0 {
		return s.prunePerTopic(ctx, policy, lock)
	}
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return 0, nil
	}
	var countEdge int64 // rows at or below this sequence exceed MaxEvents
	if policy.MaxEvents > 0 {
		if err := s.db.QueryRowContext(ctx, qPruneCountEdge, policy.MaxEvents).Scan(&countEdge); err != nil {
			return 0, err
		}
	}
	var deleted int64
	ageEdge := ageCut(policy.MaxAge)
	for {
		n, err := s.pruneOnce(ctx, countEdge, ageEdge, lock)
		deleted += n
		if err != nil || n < pruneBatch {
			return deleted, err
		}
	}
}

// ageCut returns the created_at (Unix ms) below which rows are older than
// maxAge, or the lowest value when maxAge is no limit.
func ageCut(maxAge time.Duration) int64 {
	if maxAge <= 0 {
		return math.MinInt64
	}
	return time.Now().Add(-maxAge).UnixMilli()
}

func (s *Store) pruneOnce(ctx context.Context, countEdge, ageEdge int64, lock func() func()) (deleted int64, err error) {
	defer lock()()
	err = s.writerTx(ctx, func(conn *sql.Conn) error {
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

// prunePerTopic applies a policy with Topics: each topic with rows is
// pruned by the entry that governs it, or by the default, whose MaxEvents
// counts the rows of the topics it governs and the broadcasts together.
// Every deletion is a prefix of one topic (a row is condemned by a count
// edge, a sequence, or by its age, and created_at never decreases as the
// sequence grows), made in batches by pruneTopicThrough. Nothing above the
// head read first is condemned: the topics listed after it include every
// topic of the rows at or below it, and rows appended since are the
// newest.
func (s *Store) prunePerTopic(ctx context.Context, policy storage.RetentionPolicy, lock func() func()) (int64, error) {
	h0, err := s.head(ctx, s.db)
	if err != nil {
		return 0, err
	}
	topics, err := s.pruneTopics(ctx)
	if err != nil {
		return 0, err
	}
	var (
		deleted  int64
		rest     []string // the topics the default governs
		governed = map[string]bool{}
	)
	for _, t := range topics {
		tp, ok := policy.For(t)
		if !ok {
			rest = append(rest, t)
			continue
		}
		governed[t] = true
		if tp.MaxEvents <= 0 && tp.MaxAge <= 0 {
			continue
		}
		var edge int64
		if tp.MaxEvents > 0 {
			if err := s.db.QueryRowContext(ctx, qPruneTopicEdge, t, tp.MaxEvents).Scan(&edge); err != nil {
				return deleted, err
			}
		}
		n, err := s.pruneTopicThrough(ctx, &t, min(edge, h0), ageCut(tp.MaxAge), h0, lock)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return deleted, nil
	}
	var edge int64 // the default's rows at or below it exceed MaxEvents
	if policy.MaxEvents > 0 {
		if edge, err = s.restCountEdge(ctx, policy.MaxEvents, h0, governed); err != nil {
			return deleted, err
		}
	}
	cut := ageCut(policy.MaxAge)
	for _, t := range append(rest, "") {
		topic := &t
		if t == "" {
			topic = nil
		}
		n, err := s.pruneTopicThrough(ctx, topic, edge, cut, h0, lock)
		deleted += n
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// pruneTopics lists the topics that have rows.
func (s *Store) pruneTopics(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, qPruneTopics)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// restCountEdge returns the sequence of the (maxEvents+1)-th newest row at
// or below h0 that no entry governs (a broadcast, or a topic not in
// governed), or 0: the default's count edge. It walks the newest rows of
// the log, maxEvents of the default's and every governed row among them.
func (s *Store) restCountEdge(ctx context.Context, maxEvents, h0 int64, governed map[string]bool) (int64, error) {
	if len(governed) == 0 {
		var edge int64
		err := s.db.QueryRowContext(ctx, qPruneCountEdge, maxEvents).Scan(&edge)
		return min(edge, h0), err
	}
	rows, err := s.db.QueryContext(ctx, qPruneRestNewest, h0)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		var (
			seq   int64
			topic sql.NullString
		)
		if err := rows.Scan(&seq, &topic); err != nil {
			return 0, err
		}
		if governed[topic.String] {
			continue
		}
		if n++; n > maxEvents {
			return seq, nil
		}
	}
	return 0, rows.Err()
}

// PruneTopic deletes every event of topic at or below through (see
// storage.TopicPruner), in batches, each its own write transaction under
// writeMu.
func (s *Store) PruneTopic(ctx context.Context, topic string, through int64) (int64, error) {
	if topic == "" {
		return 0, errors.Join(storage.ErrInvalid, errors.New("sqlitestore: PruneTopic of the broadcasts"))
	}
	h0, err := s.head(ctx, s.db)
	if err != nil {
		return 0, err
	}
	return s.pruneTopicThrough(ctx, &topic, min(through, h0), math.MinInt64, h0, func() func() {
		s.writeMu.Lock()
		return s.writeMu.Unlock
	})
}

// writerTx runs fn in a write transaction on the writer's connection, as
// appends do, for prune batches: that connection's commits report their
// WAL pages to the checkpointer (checkpoint.go) instead of carrying
// SQLite's automatic checkpoint. A batch on a pool connection did: every
// few batches of a large prune, its COMMIT copied the WAL into the file
// and synced it holding the write lock, and the appends queued behind it
// (TestPruneTopicCost: publish p99 up to 4× while a 1M-row topic was
// pruned). fn changes rows under the writer's caches of the newest row and
// the topics' ordinals, so they are dropped first, as when another
// connection writes. The caller holds s.writeMu.
func (s *Store) writerTx(ctx context.Context, fn func(*sql.Conn) error) error {
	if s.closed {
		return ErrClosed
	}
	if err := s.reserveWriter(ctx); err != nil {
		return err
	}
	w, broken := s.writer, false
	w.newest, w.topOK = -1, false
	err := w.beginWrite(ctx)
	if err == nil {
		if err = fn(w.conn); err == nil {
			// A fresh context: a cancelled one must not leave the transaction open.
			if _, err = w.commit.ExecContext(context.Background()); err == nil && w.autoCheckpoint > 0 {
				w.afterCommitCheckpoint()
			}
		}
		if err != nil {
			_, rerr := w.rollback.ExecContext(context.Background())
			broken = rerr != nil
		}
	}
	if broken || s.db.Stats().MaxOpenConnections == 1 {
		s.releaseWriter(broken) // as appendBatch does
	}
	return err
}
