package live

import (
	"context"
	"sync"
	"time"

	"github.com/replayd/replayd/storage"
)

// headProbe shares reads of the log's head and global watermark among the
// polls waiting for one (see window.go). Probes run one at a time, their
// starts at least probeSpacing apart: under load a probe answers every
// poll that arrived while the one before ran or waited. A poll waits for
// the next probe to start (never joins one already under way, which may
// predate it), and one probe answers every poll that waited for it.
type headProbe struct {
	mu      sync.Mutex
	pending *probeCall // not started yet: a poll arriving now waits for it
	last    *probeCall // the latest probe started
	hook    func()     // tests: called once a probe has read, before its polls are told; set before any poll
}

// probeSpacing is the least time between the starts of two probes: what
// a poll may wait, under load, for its probe to start.
const probeSpacing = 500 * time.Microsecond

type probeCall struct {
	done       chan struct{} // closed once head, mark and err are set
	started    time.Time
	head, mark int64
	err        error
}

// probeHead returns the head and the global watermark read (through
// Config.ProbeLog) in one snapshot that began after the call did.
func (h *Hub) probeHead(ctx context.Context) (head, mark int64, err error) {
	p := &h.probe
	p.mu.Lock()
	if c := p.pending; c != nil {
		p.mu.Unlock()
		select {
		case <-c.done:
			return c.head, c.mark, c.err
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	// This poll runs the probe, for every poll that arrives until it
	// starts, even if its own ctx ends meanwhile.
	c := &probeCall{done: make(chan struct{})}
	p.pending = c
	prev := p.last
	p.mu.Unlock()
	if prev != nil {
		<-prev.done
		if d := probeSpacing - time.Since(prev.started); d > 0 {
			time.Sleep(d)
		}
	}
	p.mu.Lock()
	p.pending, p.last, c.started = nil, c, time.Now()
	p.mu.Unlock()
	var pg storage.Page
	pg, c.err = h.probeLog.Read(ctx, storage.ReadRequest{After: maxSequence, Limit: 1})
	c.head, c.mark = pg.Head, pg.Watermark
	if p.hook != nil {
		p.hook()
	}
	close(c.done)
	return c.head, c.mark, c.err
}
