package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/storage"
)

// The committer: one goroutine per node (per Manager) commits the output
// of every job the node runs. A write only appends to its run's pending
// buffer and wakes the committer; the committer takes, at most once per
// Linger (default 50 ms), what every run has pending (text, events,
// progress, an end) and commits it all in ONE store transaction
// (StreamStore.UpdateStreams over the runs' topics, at most maxBatch of
// them a transaction), each run's messages in its upstream's order and its
// record (text length, event count, marks, lease, progress) in the same
// transaction. So the node costs about 1/Linger commits a second for up
// to maxBatch running jobs, however fast they write (200 jobs × 50
// tokens/s: 20 commits/s, not one per token, nor one per job per Linger),
// and one more a Linger for each maxBatch jobs beyond; and a token waits
// at most a Linger plus a commit before readers see it.
//
// A run whose pending bytes reach MaxBuffer is committed without waiting
// out the Linger. A run with nothing pending is committed (its lease
// renewed, its abandonment checked) every Lease/3: the heartbeat.
//
// A crash loses at most what was pending: the last Linger (and the commit
// in flight) of every job's text and events. What was committed of a job
// is a prefix of what its upstream wrote, with no hole: a job's messages
// are committed in order, each commit holding all that was pending of it,
// and a commit is all or nothing. The job then ends error interrupted, so
// a reader never takes a truncated answer for a complete one. A commit
// that fails (the store briefly unavailable) keeps everything pending and
// is tried again after a backoff (10 ms doubling, at most Lease/3).

// maxBatch bounds the runs one transaction commits.
const maxBatch = 256

// kick wakes the committer; full: a run's buffer reached MaxBuffer, so
// the committer does not wait out its Linger.
func (m *Manager) kick(full bool) {
	select {
	case m.wake <- struct{}{}:
	default:
	}
	if full {
		select {
		case m.full <- struct{}{}:
		default:
		}
	}
}

// commitLoop is the committer, until the hub closes: then nothing more is
// written (as a crash: the running jobs end interrupted once their lease
// lapses).
func (m *Manager) commitLoop() {
	ctx := m.cfg.Ctx
	beat := time.NewTicker(max(m.cfg.Lease/6, time.Millisecond))
	defer beat.Stop()
	defer m.stopAll()
	var last time.Time // the last commit's start
	retry := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-m.full:
		case <-beat.C:
		}
		if wait := m.cfg.Linger - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-m.full:
				t.Stop()
			}
		}
		last = time.Now()
		if err := m.commitAll(); err != nil {
			if ctx.Err() != nil {
				return
			}
			// Everything stays pending: tried again after the backoff.
			retry = min(max(2*retry, 10*time.Millisecond), max(m.cfg.Lease/3, time.Millisecond))
			m.cfg.Logger.Warn("replayd: jobs: commit the jobs' output", "err", err, "retry", retry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			m.kick(false)
			continue
		}
		retry = 0
	}
}

// stopAll refuses every write of the node's runs once the hub closed.
func (m *Manager) stopAll() {
	m.mu.Lock()
	runs := make([]*run, 0, len(m.runs))
	for _, r := range m.runs {
		runs = append(runs, r)
	}
	m.mu.Unlock()
	for _, r := range runs {
		r.stop(ErrEnded)
		r.forget()
	}
}

// part is one run's share of a commit: what it takes, and what the
// transaction found.
type part struct {
	r        *run
	n        int // pending items taken
	items    []item
	texts    []string // the text items as committed (see take)
	cut      int      // the bytes of the last item committed, when it is text
	progress json.RawMessage
	ended    *outcome

	// set in the transaction (prepare, write)
	cur             *record // the job's record, as the transaction writes it
	abandoned, lost bool
	end             *outcome
}

// take returns r's part of a commit at now, nil if it has nothing to
// commit and no heartbeat due.
func (r *run) take(now time.Time) *part {
	r.mu.Lock()
	p := &part{r: r, n: len(r.pending), items: append([]item(nil), r.pending...), progress: r.progress, ended: r.ended}
	r.mu.Unlock()
	if p.n == 0 && p.progress == nil && p.ended == nil && now.Sub(r.beat) < r.m.cfg.Lease/3 {
		return nil
	}
	// The last text item is cut after its last complete UTF-8 character
	// (an incomplete tail waits for the rest), unless the job ends.
	p.texts = make([]string, p.n)
	for i, it := range p.items {
		if it.event != nil {
			continue
		}
		b := it.text
		if i == p.n-1 && p.ended == nil {
			b, _ = splitComplete(b)
		}
		p.cut = len(b)
		p.texts[i] = validText(b)
	}
	return p
}

// commitAll commits the part of every run that has one, maxBatch runs a
// transaction.
func (m *Manager) commitAll() error {
	now := time.Now()
	m.mu.Lock()
	runs := make([]*run, 0, len(m.runs))
	for _, r := range m.runs {
		runs = append(runs, r)
	}
	m.mu.Unlock()
	var parts []*part
	for _, r := range runs {
		if p := r.take(now); p != nil {
			parts = append(parts, p)
		}
	}
	var errs []error
	for len(parts) > 0 {
		n := min(len(parts), maxBatch)
		if err := m.commitParts(parts[:n]); err != nil {
			errs = append(errs, err)
		}
		parts = parts[n:]
	}
	return errors.Join(errs...)
}

// commitParts commits parts in one transaction, then settles each run.
// The transaction reads every run's record in one statement (Prefetch),
// appends every run's messages in one call of the store (AppendAll),
// then writes the records: its statements do not grow with the runs'
// count, nor, on PostgreSQL, its round trips (the log's head row stays
// locked from the append to the commit, so that is kept short).
func (m *Manager) commitParts(parts []*part) error {
	ctx := m.cfg.Ctx
	topics := make([]string, len(parts))
	for i, p := range parts {
		topics[i] = p.r.topic
	}
	err := m.updateTopics(ctx, topics, func(a *durable.AppTx) error {
		if err := a.Prefetch(ctx, topics); err != nil {
			return err
		}
		var batches []durable.Appends
		var of []*part // batches[i] is of[i]'s
		for _, p := range parts {
			msgs, err := p.prepare(ctx, a)
			if err != nil {
				return err
			}
			if len(msgs) > 0 {
				batches = append(batches, durable.Appends{Topic: p.r.topic, Payloads: msgs})
				of = append(of, p)
			}
		}
		last, err := a.AppendAll(ctx, batches)
		if err != nil {
			return err
		}
		for i, p := range of {
			p.cur.addMark(last[i])
		}
		for _, p := range parts {
			if err := p.write(ctx, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	now := time.Now()
	for _, p := range parts {
		p.committed(now)
	}
	return nil
}

// prepare reads p's job in a and returns the messages p appends to it:
// none when the job is no longer this node's (p.lost).
func (p *part) prepare(ctx context.Context, a *durable.AppTx) ([]json.RawMessage, error) {
	r, m := p.r, p.r.m
	p.cur, p.abandoned, p.lost, p.end = nil, false, false, p.ended
	s, err := a.Get(ctx, r.topic)
	if err != nil {
		return nil, err
	}
	if s == nil {
		p.lost = true
		return nil, nil
	}
	cur, err := decodeRecord(s.App)
	if err != nil {
		return nil, err
	}
	if cur.Status != Streaming || cur.Owner != m.node {
		p.lost = true
		return nil, nil
	}
	p.cur = cur
	var ps []json.RawMessage
	for i, it := range p.items {
		if it.event != nil {
			n := cur.Events
			ps = append(ps, message{K: kindEvent, N: &n, E: it.event}.encode())
			cur.Events++
			continue
		}
		if p.texts[i] == "" {
			continue
		}
		off := cur.Text
		ps = append(ps, message{K: kindText, O: &off, T: p.texts[i]}.encode())
		cur.Text += len16(p.texts[i])
	}
	if p.progress != nil {
		ps = append(ps, message{K: kindProgress, P: p.progress}.encode())
	}
	return ps, nil
}

// write writes p's record in a, once its messages are appended, and its
// end if the upstream returned or the job was abandoned.
func (p *part) write(ctx context.Context, a *durable.AppTx) error {
	r, m, cur := p.r, p.r.m, p.cur
	if p.lost {
		return nil
	}
	now := a.Now()
	if p.progress != nil {
		cur.Progress = p.progress
	}
	cur.Updated = now
	cur.Lease = now + m.cfg.Lease.Milliseconds()
	cur.LastRead = max(cur.LastRead, r.lastRead.Load())
	if p.end == nil && now-cur.LastRead > m.cfg.AbandonAfter.Milliseconds() {
		p.abandoned = true
		p.end = &outcome{status: Error, err: errorf(CodeAbandoned, "nobody read the job for %v", m.cfg.AbandonAfter)}
	}
	if p.end != nil {
		return m.finish(ctx, a, r.topic, cur, *p.end)
	}
	return a.Set(ctx, r.topic, cur.encode(), m.expiry(cur), false)
}

// errLost is a run's writes' once the job is no longer this node's
// (another node or a reader ended it interrupted after this node's lease
// lapsed).
var errLost = errors.New("replayd: jobs: the job is no longer this node's")

// committed drops from r what p committed (what the upstream wrote since,
// and a held incomplete character, stay pending), and ends the run if the
// job ended or is not this node's any more.
func (p *part) committed(now time.Time) {
	r := p.r
	if p.lost {
		r.stop(errLost)
		r.forget()
		return
	}
	r.beat = now
	r.mu.Lock()
	n := p.n
	if n > 0 && p.items[n-1].event == nil {
		if tail := r.pending[n-1].text[p.cut:]; len(tail) > 0 {
			n--
			r.pending[n].text = append([]byte(nil), tail...)
		}
	}
	r.pending = append([]item(nil), r.pending[n:]...)
	r.size = 0
	for _, it := range r.pending {
		r.size += len(it.text) + len(it.event)
	}
	if p.progress != nil && string(r.progress) == string(p.progress) {
		r.progress = nil
	}
	r.mu.Unlock()
	if p.abandoned {
		r.stop(ErrEnded)
	}
	if p.end != nil {
		r.forget()
	}
}

// updateTopics runs fn in one stream transaction of topics and delivers
// what it appended once it committed.
func (m *Manager) updateTopics(ctx context.Context, topics []string, fn func(a *durable.AppTx) error) error {
	var a *durable.AppTx
	err := m.cfg.Store.UpdateStreams(ctx, topics, func(tx storage.StreamTx) error {
		a = durable.NewAppTx(tx, m.cfg.Now(), m.cfg.DataType)
		return fn(a)
	})
	if err == nil && m.cfg.Deliver != nil && len(a.Events()) > 0 {
		m.cfg.Deliver(a.Events())
	}
	return err
}
