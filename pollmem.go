package replayd

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/storage"
)

// Polls near the head are answered from memory: the newest rows live
// delivery dispatched are kept in a pollWindow, and a poll whose cursor
// lies in it is answered from it once a probe of the log (its head and its
// global prune watermark, one snapshot, no payload) shows that the window
// reaches the head and that nothing above the cursor was pruned.
// The answer is then the one a log read at the moment of the probe gives,
// byte for byte. Probes are shared: a poll waits for the next probe to
// start (never joins one already under way, which may predate it), and one
// probe answers every poll that waited for it.

// Default bounds of the poll window (PollOptions.MemoryEvents and
// MemoryBytes): the newest pollWindowEvents rows, and no older one once
// they hold pollWindowBytes of payload.
const (
	pollWindowEvents = 16384
	pollWindowBytes  = 4 << 20
)

// pollWindow holds a contiguous run of the newest rows live delivery
// dispatched: every row visible in the log with a sequence in (lo, hi], in
// sequence order. Every change is made under live.mu (the dispatch), and
// under its own mu, which readers take alone.
type pollWindow struct {
	mu       sync.RWMutex
	valid    bool     // lo, hi and evs describe the log
	lo, hi   int64    // the window holds every row in (lo, hi]
	loIssued bool     // lo is a row's sequence (it left the window): never foreign
	evs      []Event  // from start on: the rows, ascending
	asIs     []uint32 // asIs[i]: whether evs[i]'s payload encodes as it is (see asIsAt)
	start    int
	bytes    int // payload bytes of evs[start:]

	// maxEvents and maxBytes bound the window (PollOptions.MemoryEvents
	// and MemoryBytes); disabled: either was negative, and the window
	// holds nothing.
	maxEvents, maxBytes int
	disabled            bool

	off atomic.Bool // tests: answer every poll from the log
}

// limit sets the window's bounds, before it is used (see PollOptions).
func (w *pollWindow) limit(events, bytes int) {
	w.maxEvents, w.maxBytes = events, bytes
	w.disabled = events < 0 || bytes < 0
}

// add records rows, which must be every row in (from, last row's sequence].
// A window that does not end at from starts again there.
func (w *pollWindow) add(from int64, rows []Event) {
	if len(rows) == 0 || w.disabled {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.valid || w.hi != from {
		w.clearLocked()
		w.valid, w.lo, w.hi = true, from, from
	}
	// The payloads are copied, in one piece: Publish's caller and Subscribe
	// callbacks hold the rows' own.
	size := 0
	for i := range rows {
		size += len(rows[i].Payload)
	}
	arena := make([]byte, 0, size)
	for i := range rows {
		ev := rows[i]
		if ev.Payload != nil {
			arena = append(arena, ev.Payload...)
			ev.Payload = arena[len(arena)-len(ev.Payload) : len(arena) : len(arena)]
		}
		w.evs = append(w.evs, ev)
		w.asIs = append(w.asIs, asIsUnknown)
		w.bytes += len(ev.Payload)
	}
	w.hi = rows[len(rows)-1].Sequence
	maxEvents, maxBytes := cmp.Or(w.maxEvents, pollWindowEvents), cmp.Or(w.maxBytes, pollWindowBytes)
	for n := len(w.evs) - w.start; n > maxEvents || (n > 1 && w.bytes > maxBytes); n-- {
		ev := &w.evs[w.start]
		w.lo, w.loIssued = ev.Sequence, true
		w.bytes -= len(ev.Payload)
		*ev = Event{}
		w.start++
	}
	if w.start >= maxEvents {
		n := copy(w.evs, w.evs[w.start:])
		copy(w.asIs, w.asIs[w.start:])
		clear(w.evs[n:])
		w.evs, w.asIs, w.start = w.evs[:n], w.asIs[:n], 0
	}
}

// extend records that no row lies in (from, through]: a window that ends
// at from now ends at through.
func (w *pollWindow) extend(from, through int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.valid && w.hi == from && through > from {
		w.hi = through
	}
}

// reset empties the window: the live position moved without a dispatch of
// every row in between (a gap, a reset log, nobody subscribed).
func (w *pollWindow) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clearLocked()
}

func (w *pollWindow) clearLocked() {
	clear(w.evs)
	w.evs, w.asIs, w.start, w.bytes = w.evs[:0], w.asIs[:0], 0, 0
	w.valid, w.loIssued, w.lo, w.hi = false, false, 0, 0
}

// answer answers req from the window, given a probe of the log that found
// head and the global watermark mark: the log's answer at the probe's
// moment. The window may have gone on since (rows above head are not
// answered), but must reach head: every row up to head is then in it or
// below lo. It reports false when the window cannot give the log's answer:
// it does not reach the head (the live position lags: other processes
// appended), the cursor is outside it or not a sequence known never to be
// foreign, or rows above the cursor may have been pruned.
func (w *pollWindow) answer(req storage.ReadRequest, head, mark int64) (storage.Page, []bool, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	cursor := req.After
	if req.Limit <= 0 || req.MaxBytes <= 0 || !w.valid || head < w.lo || head > w.hi || cursor < w.lo || cursor > head || mark > cursor {
		return storage.Page{}, nil, false
	}
	evs, asIs := w.evs[w.start:], w.asIs[w.start:]
	i, found := slices.BinarySearchFunc(evs, cursor, func(ev Event, s int64) int {
		switch {
		case ev.Sequence < s:
			return -1
		case ev.Sequence > s:
			return 1
		}
		return 0
	})
	if found {
		i++
	} else if !(cursor == head || cursor == w.lo && w.loIssued) {
		// Strictly between rows: perhaps inside a range the sequence
		// floor skipped (a foreign cursor), which only the log knows.
		return storage.Page{}, nil, false
	}
	pg := storage.Page{Head: head}
	n := min(req.Limit, len(evs)-i)
	if n > 0 {
		pg.Events = make([]Event, 0, n)
	}
	clean := make([]bool, 0, n)
	size := 0
	for ; i < len(evs) && evs[i].Sequence <= head; i++ {
		ev := &evs[i]
		if !inScope(req.Scope, ev.Topic) {
			continue
		}
		if len(pg.Events) == req.Limit || size >= req.MaxBytes {
			pg.More = true
			break
		}
		pg.Events = append(pg.Events, *ev)
		clean = append(clean, asIsAt(&asIs[i], ev.Payload))
		size += len(ev.Payload)
	}
	return pg, clean, true
}

// A row's encodesAsIs is found by the first poll that answers it, not by
// add: that runs on the writer's path, where it was a tenth of the time of
// a batch. Polls find it under the window's read lock, so they store it
// atomically; add and the rest change asIs under the write lock only.
const (
	asIsUnknown uint32 = iota
	asIsYes
	asIsNo
)

// asIsAt returns encodesAsIs(payload), recorded in *state.
func asIsAt(state *uint32, payload []byte) bool {
	v := atomic.LoadUint32(state)
	if v == asIsUnknown {
		v = asIsNo
		if encodesAsIs(payload) {
			v = asIsYes
		}
		atomic.StoreUint32(state, v)
	}
	return v == asIsYes
}

// encodesAsIs reports whether raw is valid JSON that pollEncoder.raw
// would copy unchanged: compact, without <, >, &, U+2028 or U+2029.
func encodesAsIs(raw []byte) bool {
	if raw == nil || !validJSON(raw) {
		return false
	}
	inString := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			inString = !inString
		case c == '\\':
			i++
		case c == '<' || c == '>' || c == '&':
			return false
		case c == 0xE2 && i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xA8:
			return false
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}

// inScope reports whether an event of topic is visible to scope.
func inScope(scope []string, topic string) bool {
	return len(scope) == 0 || topic == "" || slices.Contains(scope, topic)
}

// headProbe shares reads of the log's head and global watermark among the
// polls waiting for one (see the top of this file). Probes run one at a
// time, their starts at least probeSpacing apart: under load a probe
// answers every poll that arrived while the one before ran or waited.
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

// probe returns the head and the global watermark read in one snapshot
// that began after the call did.
func (h *EventHub) probe(ctx context.Context) (head, mark int64, err error) {
	p := &h.live.probe
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
	if h.acquireRead(ctx) {
		var pg storage.Page
		pg, c.err = h.store.Read(ctx, storage.ReadRequest{After: maxSequence, Limit: 1})
		h.releaseRead()
		c.head, c.mark = pg.Head, pg.Watermark
	} else {
		c.err = ErrClosed
		if ctx.Err() != nil {
			c.err = ctx.Err()
		}
	}
	if p.hook != nil {
		p.hook()
	}
	close(c.done)
	return c.head, c.mark, c.err
}

// pollFromMemory answers a poll's read from the poll window, if it can
// give the log's answer; fresh as in readPoll. asIs[i], when set, tells
// that the i-th event's payload needs no check nor rewriting to be encoded.
func (h *EventHub) pollFromMemory(ctx context.Context, req storage.ReadRequest, fresh bool) (pg storage.Page, asIs []bool, ok bool) {
	w := &h.live.pollWin
	if w.disabled || w.off.Load() {
		return storage.Page{}, nil, false
	}
	if !fresh {
		w.mu.RLock()
		near := w.valid && req.After >= w.lo && req.After <= w.hi
		w.mu.RUnlock()
		if !near {
			return storage.Page{}, nil, false
		}
	}
	head, mark, err := h.probe(ctx)
	if err != nil {
		return storage.Page{}, nil, false // the log read says what went wrong
	}
	if fresh {
		h.metrics.pollMemory.Add(1)
		return storage.Page{Head: head}, nil, true
	}
	pg, asIs, ok = w.answer(req, head, mark)
	if ok {
		h.metrics.pollMemory.Add(1)
	}
	return pg, asIs, ok
}
