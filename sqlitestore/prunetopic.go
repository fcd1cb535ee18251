package sqlitestore

import (
	"context"
	"database/sql"
	"time"

	"github.com/replayd/replayd/internal/idlecpu"
	"github.com/replayd/replayd/internal/prunepace"
)

// A per-topic prune makes room for this process's appends.
//
// A prune's deletes need SQLite's write lock, as appends do, and CPU, and
// WAL pages that the checkpointer must copy. Pruning a topic of a million
// rows while 64 publishers and 1,000 SSE clients ran
// (TestPruneTopicCost, BENCHMARKS.md "Retention per topic") showed what
// each of those costs the others, and this design answers each:
//
//   - The lock: a prune deletes in transactions of its own, gapRows at a
//     time on a log appended to within quietAfter (about 0.6 ms of the
//     lock), topicPruneBatch on a quiet one, and starts one only while no
//     Append or stream transaction waits for writeMu or holds it.
//   - Its share: while the log is appended to, it works at most a
//     pruneDuty-th of the time (package prunepace): a publish then rarely
//     finds a batch in its way. On a quiet log it runs back to back.
//   - The CPU: it starts a batch only while no goroutine of this process
//     waits for a P (package idlecpu). A batch holds its P until it ends,
//     and Go has no priorities, so the publisher or SSE stream queued
//     behind it would wait.
//   - The WAL: it starts none while a checkpoint is due
//     (checkpointer.pages): a batch would grow the WAL the checkpointer is
//     copying, and a WAL it cannot keep up with makes a publish's commit
//     take the checkpoint (takeOver), holding everyone up for milliseconds.
//
// The waits are bounded: after maxYield of them a batch runs anyway, so a
// process that is never idle still prunes, slowly.
//
// An earlier design (2026-12-04) deleted a chunk of the prune inside
// each append's transaction (the prune "rode" the commits): 1M rows went
// in 2.5 s under 64 bursting publishers, but every commit took 250 µs
// instead of 40 µs, and with publishers that do not burst publish p99 was
// 4.6 times the run without. The rows a prune deletes are at or below the
// head it read first, never above h0.

// topicPruneBatch is how many rows a prune's transaction deletes at most
// on a log quiet for quietAfter; gapRows on a log appended to since.
const (
	topicPruneBatch = 1000
	gapRows         = 250
	quietAfter      = time.Second
)

// pruneDuty: while the log is appended to, a per-topic prune works at
// most 1/pruneDuty of the time: a 1M-row topic then takes about a minute
// beside 640 publishes a second (TestPruneTopicCost). Other duties were
// not measured with this design.
const pruneDuty = 20

// yieldPause: while a prune waits for room (see the top of this file) it
// looks again this often; maxYield: it runs a batch anyway after waiting
// this long.
const (
	yieldPause = 500 * time.Microsecond
	maxYield   = 100 * time.Millisecond
)

// pruneTopicThrough deletes the rows of topic (nil: the broadcasts) at or
// below edge, and those created before cut, never above h0, the oldest
// first, in batches of its own under lock (see the top of this file).
// Each batch raises the topic's watermark and the hole mark (holeKey) in
// its transaction. It returns the rows deleted by the batches that
// committed.
func (s *Store) pruneTopicThrough(ctx context.Context, topic *string, edge, cut, h0 int64, lock func() func()) (deleted int64, err error) {
	pace := prunepace.New(s.appended.Load, pruneDuty)
	var ckpt *checkpointer // s.ckpt, read under lock (set under writeMu)
	for {
		if err := s.awaitRoom(ctx, ckpt); err != nil {
			return deleted, err
		}
		limit := topicPruneBatch
		if time.Since(time.Unix(0, s.appended.Load())) < quietAfter {
			limit = gapRows
		}
		pace.Start()
		unlock := lock()
		var n int64
		err := s.writerTx(ctx, func(conn *sql.Conn) (err error) {
			n, err = pruneChunk(ctx, conn, topic, edge, cut, h0, limit)
			return err
		})
		ckpt = s.ckpt
		unlock()
		if err != nil {
			return deleted, err
		}
		deleted += n
		if s.testHookPruneChunk != nil {
			s.testHookPruneChunk(deleted)
		}
		if n < int64(limit) {
			return deleted, nil
		}
		if err := pace.Pause(ctx); err != nil {
			return deleted, err
		}
	}
}

// awaitRoom waits until no append waits for writeMu or holds it, no
// checkpoint of c (nil: none known yet) is due and no goroutine waits for
// a P, or maxYield has passed, or ctx ends, whose error it then returns.
func (s *Store) awaitRoom(ctx context.Context, c *checkpointer) error {
	start := time.Now()
	var t *time.Timer
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		room := s.writers.Load() == 0 && (c == nil || c.pages.Load() < c.due) && !idlecpu.Busy()
		if room || time.Since(start) >= maxYield {
			return nil
		}
		if t == nil {
			t = time.NewTimer(yieldPause)
			defer t.Stop()
		} else {
			t.Reset(yieldPause)
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// pruneChunk deletes, in conn's transaction, at most limit of the rows
// pruneTopicThrough condemns, the oldest first, and raises the topic's
// watermark and the hole mark to the last; it returns how many.
func pruneChunk(ctx context.Context, conn *sql.Conn, topic *string, edge, cut, h0 int64, limit int) (deleted int64, err error) {
	qHead, qDelete, key, arg := qPruneTopicHead, qPruneTopicDelete, "", any(nil)
	if topic == nil {
		qHead, qDelete = qPruneBroadcastHead, qPruneBcastDelete
	} else {
		key, arg = *topic, *topic
	}
	rows, err := conn.QueryContext(ctx, qHead, arg, limit)
	if err != nil {
		return 0, err
	}
	var through int64
	for rows.Next() {
		var seq, created int64
		if err := rows.Scan(&seq, &created); err != nil {
			rows.Close()
			return 0, err
		}
		if seq > h0 || (seq > edge && created >= cut) {
			break
		}
		through = seq
		deleted++
	}
	rows.Close()
	if err := rows.Err(); err != nil || deleted == 0 {
		return 0, err
	}
	if _, err := conn.ExecContext(ctx, qDelete, arg, through); err != nil {
		return 0, err
	}
	for _, k := range []string{key, holeKey} {
		if _, err := conn.ExecContext(ctx, qPruneMark, k, through); err != nil {
			return 0, err
		}
	}
	return deleted, nil
}
