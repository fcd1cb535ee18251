package sqlitestore

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// A per-topic prune rides the appends' commits.
//
// A prune's deletes need SQLite's write lock, as appends do. Deleting a
// topic of a million rows in transactions of its own, paced to a tenth of
// the time (the design before this one), took 34–43 s while 64 publishers
// ran, and raised publish p99 about 1.5× all along (BENCHMARKS.md
// "Retention per topic"): each batch took writeMu, and the prune's
// goroutine could lose its CPU while holding it (on two busy cores, for
// up to 130 ms), with every publish queued behind it. Now, while this
// process appends, the writer deletes a chunk of the prune (rideRows) in
// each append's transaction, after the batch's rows and before its
// commit, in a savepoint (a chunk that fails rolls back alone and fails
// the prune, never the append): about 120 µs of a goroutine that holds
// writeMu anyway, sharing the commit's write of the WAL. When no chunk
// rode a commit for rideWait and no append waits for writeMu or holds it,
// the prune deletes in transactions of its own: gapRows at a time on a
// log appended to within quietAfter, topicPruneBatch on a quiet one, back
// to back while that lasts. The same 1M rows now go in 2.4–2.8 s; the
// publish and delivery p99 while they go are 0.8–1.9× the run without,
// not yet within the 1.2× the design aims at: the prune's CPU, most of a
// core for those seconds, is what the others miss.
//
// A prune ends (PruneTopic returns) only once it is out of the writer's
// list, so the rows it reports deleted are every chunk that committed,
// and a chunk rides no commit after the prune's ctx ended.
//
// The rows a prune deletes are at or below the head it read first, so a
// chunk never deletes a row of the batch it rides, and the writer's caches
// (the newest row, the topics' ordinals) stay true: retention deletes a
// prefix of each topic, which leaves the numbering of what is kept as it
// was.

// rideRows is how many rows a chunk riding an append's commit deletes at
// most: about 120 µs of the writer's time.
const rideRows = 64

// topicPrune is a per-topic prune in progress (pruneTopicThrough): the
// rows of topic (nil: the broadcasts) at or below edge, and those created
// before cut, never above h0.
type topicPrune struct {
	ctx           context.Context // the prune's: once it ends, no chunk rides
	topic         *string
	edge, cut, h0 int64
	rode          chan struct{} // a commit carried a chunk (capacity 1)
	testHook      func(deleted int64, rides int)

	mu       sync.Mutex
	deleted  int64 // committed
	done     bool  // nothing left to delete, or err
	err      error
	lastRide time.Time
	rides    int // chunks that rode a commit
}

// progress records n rows deleted, in a transaction that committed, by a
// chunk of limit rows, or err.
func (p *topicPrune) progress(n int64, limit int, err error, ride bool) {
	p.mu.Lock()
	p.deleted += n
	p.done = p.done || err != nil || n < int64(limit)
	if p.err == nil {
		p.err = err
	}
	if ride {
		p.lastRide = time.Now()
		p.rides++
	}
	deleted, rides := p.deleted, p.rides
	p.mu.Unlock()
	if p.testHook != nil {
		p.testHook(deleted, rides)
	}
	if ride {
		select {
		case p.rode <- struct{}{}:
		default:
		}
	}
}

func (p *topicPrune) state() (deleted int64, done bool, lastRide time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleted, p.done, p.lastRide, p.err
}

// pruneTopicThrough deletes p's rows: riding this process's appends while
// they come, in batches of its own while they do not (see the top of this
// file). Each deletion raises the topic's watermark and the hole mark
// (holeKey) in its transaction.
func (s *Store) pruneTopicThrough(ctx context.Context, topic *string, edge, cut, h0 int64, lock func() func()) (int64, error) {
	p := &topicPrune{ctx: ctx, topic: topic, edge: edge, cut: cut, h0: h0, rode: make(chan struct{}, 1), testHook: s.testHookPruneChunk}
	unlock := lock()
	s.prunes = append(s.prunes, p)
	unlock()
	// end stops the rides (under writeMu, which they run under), then
	// returns what was deleted: every chunk that committed counted.
	end := func(cause error) (int64, error) {
		unlock := lock()
		for i, q := range s.prunes {
			if q == p {
				s.prunes = append(s.prunes[:i], s.prunes[i+1:]...)
				break
			}
		}
		unlock()
		deleted, _, _, err := p.state()
		if err == nil {
			err = cause
		}
		return deleted, err
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		_, done, lastRide, _ := p.state()
		if done {
			return end(nil)
		}
		if err := ctx.Err(); err != nil {
			return end(err)
		}
		wait := rideWait - time.Since(lastRide)
		if wait <= 0 && s.writers.Load() == 0 {
			limit := topicPruneBatch
			if time.Since(time.Unix(0, s.appended.Load())) < quietAfter {
				limit = gapRows
			}
			unlock := lock()
			n, err := s.pruneAlone(ctx, p, limit)
			unlock()
			p.progress(n, limit, err, false)
			continue
		}
		t.Reset(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
		case <-p.rode:
		case <-t.C:
		}
	}
}

// topicPruneBatch is how many rows a prune's own transaction deletes at
// most on a log quiet for quietAfter: some 6 ms of the write lock; gapRows
// on a log appended to since, whose next append may come meanwhile and
// wait for it.
const (
	topicPruneBatch = 1000
	gapRows         = 250
)

// rideWait: with no chunk ridden this long, and no append waiting or
// running, a prune deletes in transactions of its own; quietAfter: a log
// no append came to for this long is quiet.
const (
	rideWait   = 10 * time.Millisecond
	quietAfter = time.Second
)

// pruneAlone deletes a batch of p in a transaction of its own on the
// writer's connection. The caller holds s.writeMu.
func (s *Store) pruneAlone(ctx context.Context, p *topicPrune, limit int) (n int64, err error) {
	err = s.writerTx(ctx, func(conn *sql.Conn) error {
		n, err = pruneChunk(ctx, conn, p, limit)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// pruneChunk deletes, in conn's transaction, at most limit of p's rows,
// the oldest first, and raises the topic's watermark and the hole mark
// to the last; it returns how many.
func pruneChunk(ctx context.Context, conn *sql.Conn, p *topicPrune, limit int) (deleted int64, err error) {
	qHead, qDelete, key, arg := qPruneTopicHead, qPruneTopicDelete, "", any(nil)
	if p.topic == nil {
		qHead, qDelete = qPruneBroadcastHead, qPruneBcastDelete
	} else {
		key, arg = *p.topic, *p.topic
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
		if seq > p.h0 || (seq > p.edge && created >= p.cut) {
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

// ride deletes a chunk of the first prune in progress, if any, in the
// writer's transaction, which has inserted its batch and will commit: in a
// savepoint, so that a chunk that fails rolls back alone. It returns the
// chunk to record once the transaction committed (see rodeCommitted), and
// an error only when the savepoint could not be rolled back: the
// transaction is then unusable. The caller holds s.writeMu.
func (w *logWriter) ride() (*ridden, error) {
	var p *topicPrune
	for _, q := range w.store.prunes {
		if _, done, _, _ := q.state(); !done && q.ctx.Err() == nil {
			p = q
			break
		}
	}
	if p == nil {
		return nil, nil
	}
	ctx := context.Background() // see append: no statement runs with ctx
	if _, err := w.conn.ExecContext(ctx, "SAVEPOINT prune_ride"); err != nil {
		return nil, nil // no chunk this time
	}
	r := &ridden{p: p}
	r.n, r.err = pruneChunk(ctx, w.conn, r.p, rideRows)
	if r.err != nil {
		if _, err := w.conn.ExecContext(ctx, "ROLLBACK TO prune_ride"); err != nil {
			return nil, err
		}
	}
	if _, err := w.conn.ExecContext(ctx, "RELEASE prune_ride"); err != nil {
		return nil, err
	}
	return r, nil
}

// ridden is a chunk that rode a commit.
type ridden struct {
	p   *topicPrune
	n   int64
	err error
}

// committed records r once its transaction committed.
func (r *ridden) committed() {
	if r != nil {
		r.p.progress(r.n, rideRows, r.err, true)
	}
}
