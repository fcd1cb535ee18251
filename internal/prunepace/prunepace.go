// Package prunepace paces a long prune so that it leaves the log to its
// publishers and readers: the per-topic prunes of replaydpg and of
// sqlitestore (which also waits for room before each batch:
// sqlitestore/prunetopic.go).
//
// A prune's batches take the write lock that appends need (on SQLite), and
// CPU and I/O that publishers and readers need (on every store): run back
// to back, 1,000-row batches of a 1M-row topic held SQLite's lock nearly
// all the time and raised publish p99 10–18× (TestPruneTopicCost);
// pausing as long as each batch took still left 0.6–6×. So while the log
// is appended to (its head seen moving within Busy), a paced prune works
// at most 1/duty of the time, its store's choice: after each batch it
// pauses duty-1 times as long as the batch took, between 2 and 100 ms. On
// a quiet log it runs its batches back to back.
//
// Why "within Busy" and not "since the last batch": appends that queued
// for the lock during a batch may lose it to the next batch, taken at once
// (sync.Mutex is not fair until a waiter has waited a millisecond), so the
// head rarely moves between two batches of a prune that never pauses.
package prunepace

import (
	"context"
	"time"
)

const (
	// Busy: a log whose head was seen moving this recently is being
	// appended to.
	Busy = time.Second

	minPause, maxPause = 2 * time.Millisecond, 100 * time.Millisecond
)

// Pacer paces one prune. Make one per prune with New.
type Pacer struct {
	issued func() int64 // the store's highest sequence it knows was issued
	duty   int
	last   int64
	busy   time.Time // when last was seen to move
	start  time.Time // the current batch's start
}

// New returns a Pacer over issued, which reports the highest sequence the
// store knows its log issued (its appends' and the heads it read), or any
// value that changes as the log is appended to, working at most 1/duty of
// the time while it is.
func New(issued func() int64, duty int) *Pacer {
	return &Pacer{issued: issued, last: issued(), duty: max(duty, 1)}
}

// Start marks the start of a batch.
func (p *Pacer) Start() { p.start = time.Now() }

// Pause, after a batch, waits as the package's doc says (not at all on a
// quiet log), or until ctx ends, whose error it then returns.
func (p *Pacer) Pause(ctx context.Context) error {
	took := time.Since(p.start)
	if now := p.issued(); now != p.last {
		p.last, p.busy = now, time.Now()
	}
	if time.Since(p.busy) > Busy {
		return nil // a quiet log: nobody to make room for
	}
	t := time.NewTimer(min(max(took*time.Duration(p.duty-1), minPause), maxPause))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
