package jobs

import (
	"context"
	"strings"
	"time"

	"github.com/replayd/replayd/internal/durable"
)

// Reads through the hub's handlers (Handler(), PollHandler(), the Durable
// Streams protocol) count against abandonment as Read's do. The hub calls
// Reading with the topics of each SSE stream (for as long as it is open),
// each poll (for as long as it waits) and each Durable Streams read
// (catch-up, long poll, SSE); the topics that are jobs' count as reads of
// those jobs, at once and then every tick (AbandonAfter/10) while the
// reader stays open.
//
// A read of a job this node runs is a store of the time in the run (no
// write). A read of a job another node runs (or of a topic under the
// prefix that is no job) is a write of the record's lastRead, so that the
// node running it sees it: at most one per job per tick, on a goroutine
// of its own (the handler does not wait for it). A global scope (no
// topics) counts for no job: a tail of everything would keep every job
// alive.

// readTick is how often a reader held open counts again, and the least
// time between two writes of a job's lastRead by this node.
func (m *Manager) readTick() time.Duration { return max(m.cfg.AbandonAfter/10, time.Millisecond) }

// Reading counts a read of every job among topics, and, until done is
// called, keeps counting one every tick. It returns nil when none of the
// topics is a job's.
func (m *Manager) Reading(topics []string) (done func()) {
	var ids []string
	for _, t := range topics {
		if id, ok := strings.CutPrefix(t, m.cfg.TopicPrefix); ok && validID(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	now := m.cfg.Now().UnixMilli()
	m.mu.Lock()
	for _, id := range ids {
		m.open[id]++
		m.noted(id, now)
	}
	m.mu.Unlock()
	return func() {
		now := m.cfg.Now().UnixMilli()
		m.mu.Lock()
		for _, id := range ids {
			if m.open[id]--; m.open[id] <= 0 {
				delete(m.open, id)
			}
			m.noted(id, now) // it read until now
		}
		m.mu.Unlock()
	}
}

// noted records a read of job id at now (m.mu held): in its run if this
// node runs it, else a write of its record's lastRead, unless this node
// wrote one less than a tick ago.
func (m *Manager) noted(id string, now int64) {
	if r := m.runs[id]; r != nil {
		r.lastRead.Store(now)
		return
	}
	if now-m.wrote[id] < m.readTick().Milliseconds() {
		return
	}
	m.wrote[id] = now
	_ = m.cfg.Go(func() { m.writeRead(m.cfg.Ctx, id, now) }) // ErrClosed: the hub is closing, nothing to keep
}

// holdReads counts a read of every job with a reader open on this node,
// every tick, until the hub closes; and forgets the writes older than a
// tick (their throttle is over).
func (m *Manager) holdReads() {
	t := time.NewTicker(m.readTick())
	defer t.Stop()
	for {
		select {
		case <-m.cfg.Ctx.Done():
			return
		case <-t.C:
		}
		now := m.cfg.Now().UnixMilli()
		m.mu.Lock()
		for id, at := range m.wrote {
			if now-at >= m.readTick().Milliseconds() {
				delete(m.wrote, id)
			}
		}
		for id := range m.open {
			m.noted(id, now)
		}
		m.mu.Unlock()
	}
}

// writeRead writes now as job id's lastRead, if it is streaming and its
// record says less.
func (m *Manager) writeRead(ctx context.Context, id string, now int64) {
	topic := m.topic(id)
	err := m.update(ctx, topic, func(a *durable.AppTx) error {
		s, err := a.Get(ctx, topic)
		if err != nil || s == nil || s.App == nil {
			return err
		}
		cur, err := decodeRecord(s.App)
		if err != nil || cur.Status != Streaming || cur.LastRead >= now {
			return nil // not a job's stream, or nothing to write
		}
		cur.LastRead = now
		return a.Set(ctx, topic, cur.encode(), m.expiry(cur), false)
	})
	if err != nil && ctx.Err() == nil {
		m.cfg.Logger.Warn("replayd: jobs: record a read", "job", id, "err", err)
	}
}
