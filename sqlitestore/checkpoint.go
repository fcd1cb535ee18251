package sqlitestore

import (
	"context"
	"database/sql"
	"log/slog"
	"sync/atomic"
)

// checkpointer takes the WAL's checkpoints off the publish path.
//
// SQLite checkpoints a WAL database inside the COMMIT that takes the WAL
// past wal_autocheckpoint pages (1,000 by default): it copies the WAL's
// pages into the database file and syncs it before that COMMIT returns. A
// one-row commit writes about five pages, so every ~200th lone publish
// carried a checkpoint and took 4-6 ms instead of 60-90 µs (BENCHMARKS.md,
// "Latency tail"). The writer's connection therefore runs with
// wal_autocheckpoint off (setPragmas), counts the pages each of its commits
// wrote to the WAL (SQLITE_DBSTATUS_CACHE_WRITE, read without a
// statement), and once as many as the pool's wal_autocheckpoint have been
// written, wakes this goroutine, which runs a PASSIVE checkpoint (it never
// waits for readers or writers) on a pool connection of its own. The WAL
// stays as bounded as with SQLite's own checkpoints; only who waits for
// them changes.
//
// A checkpoint copies the pages the WAL held when it began; SQLite starts
// the WAL over from its beginning only when a write begins after a
// checkpoint that copied every page. Under a sustained stream of commits
// each checkpoint overlaps the next commit and the WAL would grow without
// end, so when a checkpoint finds the WAL past behindFactor times due
// pages, the writer takes the next one itself, after a commit, holding the
// store's write mutex: nothing of this process writes meanwhile, the
// checkpoint completes and the next write starts the WAL over. That is
// SQLite's own behaviour, kept for a log written without pause; a log
// written with pauses (100 lone publishes a second, say) never pays it.
//
// Other connections keep their automatic checkpoints: the application's
// transactions (PublishTx, InTx), prune batches, and other processes on the
// file.
type checkpointer struct {
	db     *sql.DB
	logger *slog.Logger // nil: discard
	due    int64        // pages written since the last checkpoint that make the next one due
	pages  atomic.Int64 // pages written to the WAL since the last checkpoint began
	behind atomic.Bool  // the last checkpoint found the WAL past behindFactor×due pages
	wake   chan struct{}
	ctx    context.Context // cancelled by stop
	cancel context.CancelFunc
	done   chan struct{}

	// testHook, if set, runs before each checkpoint; testDone after it.
	testHook, testDone func()
}

// startCheckpointer starts the goroutine, which checkpoints once due pages
// have been written; stop ends it.
func startCheckpointer(db *sql.DB, due int64, logger *slog.Logger) *checkpointer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &checkpointer{db: db, logger: logger, due: due, wake: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go c.run()
	return c
}

// wrote records that a commit wrote pages to the WAL, and wakes the
// goroutine when a checkpoint is due. It never blocks.
func (c *checkpointer) wrote(pages int) {
	if pages > 0 && c.pages.Add(int64(pages)) >= c.due {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (c *checkpointer) run() {
	defer close(c.done)
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.wake:
		}
		if c.testHook != nil {
			c.testHook()
		}
		// Pages written from here on count towards the next checkpoint:
		// this one may not reach them.
		c.pages.Store(0)
		var busy, logFrames, done int64
		err := c.db.QueryRowContext(c.ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logFrames, &done)
		if err == nil && logFrames >= behindFactor*c.due {
			c.behind.Store(true)
		}
		if err != nil && c.ctx.Err() == nil && c.logger != nil {
			// The next commits bring the next attempt; SQLite's own
			// checkpoint on the last close, or another connection's, does
			// the rest.
			c.logger.Warn("replayd: WAL checkpoint failed", "err", err)
		}
		if c.testDone != nil {
			c.testDone()
		}
	}
}

// behindFactor is how many times due pages the WAL may hold before the
// writer checkpoints it itself (see checkpointer).
const behindFactor = 4

// takeOver reports whether the writer should checkpoint the WAL itself
// after its commit, and if so hands the turn to it. The caller holds the
// store's write mutex.
func (c *checkpointer) takeOver() bool {
	if !c.behind.CompareAndSwap(true, false) {
		return false
	}
	c.pages.Store(0)
	return true
}

// stop ends the goroutine, cancelling a checkpoint in progress, and waits
// for it.
func (c *checkpointer) stop() {
	c.cancel()
	<-c.done
}
