package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/internal/durable"
)

// A run is a job this node runs: the upstream on one goroutine, and the
// flusher on another, which alone commits: the coalesced text and events,
// the progress, the lease's renewal, the end.
//
// Coalescing: a write only appends to the pending buffer; the flusher
// commits it, in one transaction, Linger after the first pending write
// (or at once when MaxBuffer bytes are pending, on a heartbeat, and at the
// end). A token-per-write upstream costs one commit per Linger, not one
// per token. A crash loses at most what was pending (the last Linger of
// text, or MaxBuffer bytes): what was committed is a prefix of what the
// upstream wrote, and the job then ends error interrupted, so a reader
// never takes a truncated answer for a complete one.
type run struct {
	m      *Manager
	id     string
	topic  string
	ctx    context.Context // the upstream's
	cancel context.CancelFunc

	lastRead atomic.Int64 // a read on this node (Unix ms)

	mu       sync.Mutex
	pending  []item          // text and events, in the upstream's order
	size     int             // bytes pending
	progress json.RawMessage // the latest, not yet committed
	stopped  error           // set once nothing more is accepted
	wake     chan struct{}   // 1: something is pending
	end      chan outcome    // 1: the upstream's outcome
}

// An item is pending text or one pending event.
type item struct {
	text  []byte
	event json.RawMessage
}

// ErrEnded is a Writer's once the job ended (abandoned, or taken over by
// another node) or its upstream returned.
var ErrEnded = errors.New("replayd: jobs: the job ended")

// Writer is what an upstream writes through. Its methods are safe for
// concurrent use; they never block on the store.
type Writer struct{ r *run }

// Write appends p to the job's text (an io.Writer). A UTF-8 character
// split across writes is joined; invalid UTF-8 is stored as U+FFFD.
func (w *Writer) Write(p []byte) (int, error) {
	r := w.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped != nil {
		return 0, r.stopped
	}
	if n := len(r.pending); n > 0 && r.pending[n-1].event == nil {
		r.pending[n-1].text = append(r.pending[n-1].text, p...)
	} else {
		r.pending = append(r.pending, item{text: append([]byte(nil), p...)})
	}
	r.size += len(p)
	r.kick()
	return len(p), nil
}

// WriteString appends s to the job's text.
func (w *Writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

// Emit appends a structured event (any JSON value) to the job's events,
// after those emitted before it. An object without a "timestamp" gets one
// (Unix ms), as stream-relay's emit does.
func (w *Writer) Emit(event any) error {
	b, err := json.Marshal(event)
	if err != nil {
		return fmt.Errorf("replayd: jobs: emit: %w", err)
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) == nil && obj != nil {
		if _, ok := obj["timestamp"]; !ok {
			obj["timestamp"] = json.RawMessage(fmt.Sprint(w.r.m.cfg.Now().UnixMilli()))
			b, _ = json.Marshal(obj)
		}
	}
	r := w.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped != nil {
		return r.stopped
	}
	r.pending = append(r.pending, item{event: b})
	r.size += len(b)
	r.kick()
	return nil
}

// Progress is an application-level progress update (stream-relay's
// progress()): only the latest is kept.
type Progress struct {
	Phase   string `json:"phase,omitempty"`
	Message string `json:"message,omitempty"`
	Data    any    `json:"data,omitempty"`
}

// Progress replaces the job's progress snapshot; it is committed with the
// next flush, with its time as updated_at.
func (w *Writer) Progress(p Progress) error {
	b, err := json.Marshal(struct {
		Progress
		UpdatedAt int64 `json:"updated_at"`
	}{p, w.r.m.cfg.Now().UnixMilli()})
	if err != nil {
		return fmt.Errorf("replayd: jobs: progress: %w", err)
	}
	r := w.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped != nil {
		return r.stopped
	}
	r.progress = b
	r.kick()
	return nil
}

// ID is the job's id.
func (w *Writer) ID() string { return w.r.id }

// kick wakes the flusher (r.mu held).
func (r *run) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run starts rec's run on this node. A hub that closed meanwhile runs
// nothing: the job's lease lapses and it ends interrupted.
func (m *Manager) run(id, topic string, rec *record, fn Func) {
	ctx, cancel := context.WithCancel(m.cfg.Ctx)
	r := &run{m: m, id: id, topic: topic, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), end: make(chan outcome, 1)}
	r.lastRead.Store(rec.LastRead)
	m.mu.Lock()
	m.runs[id] = r
	m.mu.Unlock()
	if err := m.cfg.Go(r.flusher); err != nil {
		r.forget()
		return
	}
	if err := m.cfg.Go(func() { r.end <- r.upstream(fn) }); err != nil {
		cancel()
	}
}

// upstream runs fn and returns how the job ends.
func (r *run) upstream(fn Func) (o outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = outcome{status: Error, err: errorf(CodePanicked, "the upstream panicked: %v", p)}
		}
	}()
	meta, err := fn(r.ctx, &Writer{r: r})
	if err != nil {
		return outcome{status: Error, err: errorf(CodeFailed, "%v", err)}
	}
	o = outcome{status: Complete}
	if meta != nil {
		b, err := json.Marshal(meta)
		if err != nil {
			return outcome{status: Error, err: errorf(CodeFailed, "the upstream's metadata: %v", err)}
		}
		o.meta = b
	}
	return o
}

func (r *run) forget() {
	r.cancel()
	r.m.mu.Lock()
	if r.m.runs[r.id] == r {
		delete(r.m.runs, r.id)
	}
	r.m.mu.Unlock()
}

// stop refuses every later write with err.
func (r *run) stop(err error) {
	r.mu.Lock()
	if r.stopped == nil {
		r.stopped = err
	}
	r.mu.Unlock()
}

// errLost is a flush's when the job is no longer this node's (another
// node or a reader ended it interrupted after this node's lease lapsed).
var errLost = errors.New("replayd: jobs: the job is no longer this node's")

// flusher commits what the upstream writes until the job ends, or the
// hub closes (then nothing more is written: as a crash, the job ends
// interrupted once its lease lapses).
func (r *run) flusher() {
	defer r.forget()
	cfg := &r.m.cfg
	beat := time.NewTicker(max(cfg.Lease/3, time.Millisecond))
	defer beat.Stop()
	var linger *time.Timer
	var lingerC <-chan time.Time
	retry := time.Duration(0)
	for {
		var o *outcome
		select {
		case <-cfg.Ctx.Done():
			return
		case <-r.wake:
			r.mu.Lock()
			full := r.size >= cfg.MaxBuffer
			r.mu.Unlock()
			if !full {
				if lingerC == nil {
					linger = time.NewTimer(cfg.Linger)
					lingerC = linger.C
				}
				continue
			}
		case <-lingerC:
		case <-beat.C:
		case out := <-r.end:
			r.stop(ErrEnded)
			o = &out
		}
		if linger != nil {
			linger.Stop()
			linger, lingerC = nil, nil
		}
		done, err := r.flush(o)
		switch {
		case done:
			return
		case err != nil && cfg.Ctx.Err() != nil:
			return
		case err != nil:
			// The pending writes are kept; the next beat tries again.
			retry = min(max(2*retry, 10*time.Millisecond), cfg.Lease/3)
			cfg.Logger.Warn("replayd: jobs: commit a job's output", "job", r.id, "err", err, "retry", retry)
			if o != nil {
				select {
				case <-cfg.Ctx.Done():
					return
				case <-time.After(retry):
				}
				r.end <- *o
			}
		default:
			retry = 0
		}
	}
}

// flush commits what is pending, renews the lease, and ends the job when
// o is set or it was abandoned. done: the job ended (or is not this
// node's any more) and the flusher stops.
func (r *run) flush(o *outcome) (done bool, err error) {
	m := r.m
	r.mu.Lock()
	n := len(r.pending)
	items := append([]item(nil), r.pending...)
	progress := r.progress
	r.mu.Unlock()
	// The text items as committed: the last one cut after its last
	// complete UTF-8 character (an incomplete tail waits for the rest),
	// unless the job ends.
	texts := make([]string, n)
	var cut int // the bytes of the last item committed, when it is text
	for i, it := range items {
		if it.event != nil {
			continue
		}
		b := it.text
		if i == n-1 && o == nil {
			b, _ = splitComplete(b)
		}
		cut = len(b)
		texts[i] = validText(b)
	}
	var abandoned, lost bool
	ended := o
	err = m.update(m.cfg.Ctx, r.topic, func(a *durable.AppTx) error {
		abandoned, lost, ended = false, false, o
		s, err := a.Get(m.cfg.Ctx, r.topic)
		if err != nil {
			return err
		}
		if s == nil {
			lost = true
			return nil
		}
		cur, err := decodeRecord(s.App)
		if err != nil {
			return err
		}
		if cur.Status != Streaming || cur.Owner != m.node {
			lost = true
			return nil
		}
		now := a.Now()
		var ps []json.RawMessage
		for i, it := range items {
			if it.event != nil {
				n := cur.Events
				ps = append(ps, message{K: kindEvent, N: &n, E: it.event}.encode())
				cur.Events++
				continue
			}
			if texts[i] == "" {
				continue
			}
			off := cur.Text
			ps = append(ps, message{K: kindText, O: &off, T: texts[i]}.encode())
			cur.Text += len16(texts[i])
		}
		if len(ps) > 0 {
			seq, err := a.Append(m.cfg.Ctx, r.topic, ps)
			if err != nil {
				return err
			}
			cur.addMark(seq)
		}
		if progress != nil {
			cur.Progress = progress
		}
		cur.Updated = now
		cur.Lease = now + m.cfg.Lease.Milliseconds()
		cur.LastRead = max(cur.LastRead, r.lastRead.Load())
		if ended == nil && now-cur.LastRead > m.cfg.AbandonAfter.Milliseconds() {
			abandoned = true
			ended = &outcome{status: Error, err: errorf(CodeAbandoned, "nobody read the job for %v", m.cfg.AbandonAfter)}
		}
		if ended != nil {
			return m.finish(m.cfg.Ctx, a, r.topic, cur, *ended)
		}
		return a.Set(m.cfg.Ctx, r.topic, cur.encode(), m.expiry(cur), false)
	})
	if err != nil {
		return false, err
	}
	if lost {
		r.stop(errLost)
		r.cancel()
		return true, nil
	}
	// Committed: drop what was taken; what the upstream wrote since (and
	// a held incomplete character) stays pending.
	r.mu.Lock()
	if n > 0 && items[n-1].event == nil {
		if tail := r.pending[n-1].text[cut:]; len(tail) > 0 {
			n--
			r.pending[n].text = append([]byte(nil), tail...)
		}
	}
	r.pending = append([]item(nil), r.pending[n:]...)
	r.size = 0
	for _, it := range r.pending {
		r.size += len(it.text) + len(it.event)
	}
	if progress != nil && string(r.progress) == string(progress) {
		r.progress = nil
	}
	r.mu.Unlock()
	if abandoned {
		r.stop(ErrEnded)
		r.cancel()
	}
	return ended != nil, nil
}
