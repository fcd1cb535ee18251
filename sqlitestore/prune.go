package sqlitestore

import (
	"context"
	"database/sql"
	"time"

	"github.com/replayd/replayd/storage"
)

// pruneBatch is how many rows one retention transaction deletes at most, so
// a large prune holds the write lock for milliseconds at a time.
const pruneBatch = 1000

// prune deletes, in batches of pruneBatch, the oldest rows that policy
// condemns, recording each topic's prune watermark in the same transaction
// as the delete. It returns how many rows it deleted.
func (s *Store) prune(ctx context.Context, policy storage.RetentionPolicy, lock func() func()) (int64, error) {
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return 0, nil
	}
	var countEdge int64 // rows at or below this sequence exceed MaxEvents
	if policy.MaxEvents > 0 {
		if err := s.db.QueryRowContext(ctx, qPruneCountEdge, policy.MaxEvents).Scan(&countEdge); err != nil {
			return 0, err
		}
	}
	var ageEdge int64 = -1 << 63 // rows created before this are too old
	if policy.MaxAge > 0 {
		ageEdge = time.Now().Add(-policy.MaxAge).UnixMilli()
	}
	var deleted int64
	for {
		n, err := s.pruneOnce(ctx, countEdge, ageEdge, lock)
		deleted += n
		if err != nil || n < pruneBatch {
			return deleted, err
		}
	}
}

func (s *Store) pruneOnce(ctx context.Context, countEdge, ageEdge int64, lock func() func()) (deleted int64, err error) {
	defer lock()()
	err = s.writeTx(ctx, func(conn *sql.Conn) error {
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
