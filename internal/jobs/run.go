package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A run is a job this node runs: the upstream on a goroutine of its own;
// the node's committer (commit.go) alone commits its output, with every
// other run's, in one transaction per Linger.
type run struct {
	m      *Manager
	id     string
	topic  string
	ctx    context.Context // the upstream's
	cancel context.CancelFunc

	lastRead atomic.Int64 // a read on this node (Unix ms)
	beat     time.Time    // the last commit of the run (the committer's alone)

	mu       sync.Mutex
	pending  []item          // text and events, in the upstream's order
	size     int             // bytes pending
	progress json.RawMessage // the latest, not yet committed
	ended    *outcome        // the upstream's, once it returned, until committed
	stopped  error           // set once nothing more is accepted
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

// kick tells the committer that r has something pending (r.mu held).
func (r *run) kick() { r.m.kick(r.size >= r.m.cfg.MaxBuffer) }

// run starts rec's run on this node. A hub that closed meanwhile runs
// nothing: the job's lease lapses and it ends interrupted.
func (m *Manager) run(id, topic string, rec *record, fn Func) {
	ctx, cancel := context.WithCancel(m.cfg.Ctx)
	r := &run{m: m, id: id, topic: topic, ctx: ctx, cancel: cancel, beat: time.Now()}
	r.lastRead.Store(rec.LastRead)
	m.mu.Lock()
	m.runs[id] = r
	m.mu.Unlock()
	if err := m.cfg.Go(func() { r.end(r.upstream(fn)) }); err != nil {
		r.forget()
	}
}

// end takes the upstream's outcome: nothing more is written, and the next
// commit ends the job.
func (r *run) end(o outcome) {
	r.mu.Lock()
	if r.stopped == nil {
		r.stopped = ErrEnded
	}
	r.ended = &o
	r.kick()
	r.mu.Unlock()
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
