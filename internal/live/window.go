package live

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/replayd/replayd/storage"
)

// Polls near the head are answered from memory: the newest rows live
// delivery dispatched are kept in a window, and a poll whose cursor lies
// in it is answered from it once a probe of the log (its head and its
// global prune watermark, one snapshot, no payload; probe.go) shows that
// the window reaches the head and that nothing above the cursor was
// pruned. The answer is then the one a log read at the moment of the probe
// gives, byte for byte.

// Default bounds of the poll window (the root's PollOptions.MemoryEvents
// and MemoryBytes): the newest WindowEvents rows, and no older one once
// they hold WindowBytes of payload.
const (
	WindowEvents = 16384
	WindowBytes  = 4 << 20
)

// window holds a contiguous run of the newest rows live delivery
// dispatched: every row visible in the log with a sequence in (lo, hi], in
// sequence order. Every change is made under Hub.mu (the dispatch), and
// under its own mu, which readers take alone.
type window struct {
	mu       sync.RWMutex
	valid    bool            // lo, hi and evs describe the log
	lo, hi   int64           // the window holds every row in (lo, hi]
	loIssued bool            // lo is a row's sequence (it left the window): never foreign
	evs      []storage.Event // from start on: the rows, ascending
	asIs     []uint32        // asIs[i]: whether evs[i]'s payload encodes as it is (see asIsAt)
	start    int
	bytes    int // payload bytes of evs[start:]

	// maxEvents and maxBytes bound the window (Config.WindowEvents and
	// WindowBytes); disabled: either was negative, and the window holds
	// nothing.
	maxEvents, maxBytes int
	disabled            bool

	off atomic.Bool // tests: answer every poll from the log
}

// limit sets the window's bounds, before it is used (see Config).
func (w *window) limit(events, bytes int) {
	w.maxEvents, w.maxBytes = events, bytes
	w.disabled = events < 0 || bytes < 0
}

// add records rows, which must be every row in (from, last row's sequence].
// A window that does not end at from starts again there.
func (w *window) add(from int64, rows []storage.Event) {
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
	maxEvents, maxBytes := cmp.Or(w.maxEvents, WindowEvents), cmp.Or(w.maxBytes, WindowBytes)
	for n := len(w.evs) - w.start; n > maxEvents || (n > 1 && w.bytes > maxBytes); n-- {
		ev := &w.evs[w.start]
		w.lo, w.loIssued = ev.Sequence, true
		w.bytes -= len(ev.Payload)
		*ev = storage.Event{}
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
func (w *window) extend(from, through int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.valid && w.hi == from && through > from {
		w.hi = through
	}
}

// reset empties the window: the live position moved without a dispatch of
// every row in between (a gap, a reset log, nobody subscribed).
func (w *window) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clearLocked()
}

func (w *window) clearLocked() {
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
// foreign, or rows above the cursor may have been pruned. encodesAsIs is
// Config.EncodesAsIs.
func (w *window) answer(req storage.ReadRequest, head, mark int64, encodesAsIs func([]byte) bool) (storage.Page, []bool, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	cursor := req.After
	if req.Limit <= 0 || req.MaxBytes <= 0 || !w.valid || head < w.lo || head > w.hi || cursor < w.lo || cursor > head || mark > cursor {
		return storage.Page{}, nil, false
	}
	evs, asIs := w.evs[w.start:], w.asIs[w.start:]
	i, found := slices.BinarySearchFunc(evs, cursor, func(ev storage.Event, s int64) int {
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
		pg.Events = make([]storage.Event, 0, n)
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
		clean = append(clean, asIsAt(&asIs[i], ev.Payload, encodesAsIs))
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
func asIsAt(state *uint32, payload []byte, encodesAsIs func([]byte) bool) bool {
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

// inScope reports whether an event of topic is visible to scope.
func inScope(scope []string, topic string) bool {
	return len(scope) == 0 || topic == "" || slices.Contains(scope, topic)
}

// AnswerPoll answers a poll's read from the window, if it can give the
// log's answer: for a fresh request (req.After unused) only the head, read
// by a probe. asIs[i], when set, tells that the i-th event's payload needs
// no check nor rewriting to be encoded (Config.EncodesAsIs). false: read
// the log.
func (h *Hub) AnswerPoll(ctx context.Context, req storage.ReadRequest, fresh bool) (pg storage.Page, asIs []bool, ok bool) {
	w := &h.window
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
	head, mark, err := h.probeHead(ctx)
	if err != nil {
		return storage.Page{}, nil, false // the log read says what went wrong
	}
	if fresh {
		return storage.Page{Head: head}, nil, true
	}
	return w.answer(req, head, mark, h.encodesAsIs)
}
