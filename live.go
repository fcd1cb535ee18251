package replayd

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/storage"
)

// live is a hub's live delivery: one live position, and the subscribers
// every row above it reaches exactly once, in sequence order, whichever path
// brought the row (this hub's publish, or the tail reading other processes'
// writes).
type live struct {
	// catchMu orders deliveries: it is held by whoever delivers (the
	// writer's deliver, the tail's poll) for the whole of a delivery, the
	// log reads of a catch-up included, and by whoever moves pos. The reads
	// are made without mu, so a slow read stalls only the next delivery,
	// never a stream registering or a subscriber callback's caller.
	catchMu sync.Mutex
	// mu guards pos and newestAt and is held while rows are dispatched:
	// user callbacks run under it. pos moves only under both locks.
	mu  sync.Mutex
	pos int64 // the highest sequence delivered live
	// newestAt is the CreatedAt of the newest row dispatched: the tail
	// resets it before a poll and reads its lag from it after.
	newestAt time.Time

	// subsMu guards the subscriber sets. A subscriber registered under it
	// gets every row dispatched after that moment; every row dispatched
	// before was committed before, so a head read afterwards covers it.
	subsMu  sync.Mutex
	byTopic map[string]map[*stream]struct{}     // "" = global connections
	funcs   []*funcSub                          // copy on write
	waiters map[string]map[*pollWaiter]struct{} // waiting long polls; "" = global

	// pollWin holds the newest rows dispatched, to answer polls near the
	// head (pollmem.go); probe shares those polls' reads of the head.
	pollWin pollWindow
	probe   headProbe
}

// pollWaiter is a long poll waiting for an event of its scope. dispatch
// wakes it at most once per registration: it is unregistered as it is
// woken, and registers again before its next read of the log.
type pollWaiter struct {
	topics []string
	wake   chan struct{} // capacity 1; sent to by dispatch, read by the poll
	armed  bool          // registered; guarded by live.subsMu
}

type funcSub struct {
	fn   func(Event)
	gap  func(Gap) // nil: a plain Subscribe
	gone atomic.Bool
}

// Gap reasons: why a [Gap] happened. They are the SSE gap frame's reasons
// where the cases match.
const (
	// GapPruned: retention deleted the rows before they could be delivered.
	GapPruned = "pruned"
	// GapUnreadable: the rows could not be read from the log (a database
	// error), so they cannot be delivered in order.
	GapUnreadable = "unreadable"
	// GapUnknownCursor: the log was reset or replaced from outside (a new
	// database file, every row deleted and the sequence reset, a backup
	// restored in place), so the head fell below the live position, or the
	// live position is a sequence the log says it never issued. Events
	// after this gap are of another history: their sequences may be lower
	// than those before it.
	GapUnknownCursor = "unknown_cursor"
)

// A Gap tells an in-process subscriber (see [EventHub.SubscribeWithGaps])
// that rows will not be delivered to it live. Events after the gap have
// sequences above Through.
type Gap struct {
	Reason string // GapPruned, GapUnreadable or GapUnknownCursor
	// After is the live position before the gap: the highest sequence the
	// hub had delivered (or passed over with nobody subscribed).
	After int64
	// From and Through are the first and last sequence of the hole; some of
	// its sequences may never have been used. For GapPruned and
	// GapUnreadable, From is After+1. For GapUnknownCursor, the hole is the
	// new log's rows up to Through: From is 1, and the range is empty
	// (Through is 0) when the new log had none yet.
	From, Through int64
}

// liveEvent is an event on its way to subscribers, with its SSE frame
// encoded once for every connection.
type liveEvent struct {
	Event
	frame []byte
}

func (l *live) init() {
	l.byTopic = make(map[string]map[*stream]struct{})
	l.waiters = make(map[string]map[*pollWaiter]struct{})
}

// addWaiter registers w: the next row of its scope dispatched wakes it.
func (l *live) addWaiter(w *pollWaiter) {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	if w.armed {
		return
	}
	w.armed = true
	for _, topic := range waiterKeys(w) {
		set := l.waiters[topic]
		if set == nil {
			set = make(map[*pollWaiter]struct{})
			l.waiters[topic] = set
		}
		set[w] = struct{}{}
	}
}

// removeWaiter unregisters w if it is registered.
func (l *live) removeWaiter(w *pollWaiter) {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	l.disarmLocked(w)
}

func (l *live) disarmLocked(w *pollWaiter) {
	if !w.armed {
		return
	}
	w.armed = false
	for _, topic := range waiterKeys(w) {
		set := l.waiters[topic]
		delete(set, w)
		if len(set) == 0 {
			delete(l.waiters, topic)
		}
	}
}

// wakeLocked wakes, and unregisters, every waiter of set. The caller
// holds subsMu.
func (l *live) wakeLocked(set map[*pollWaiter]struct{}) {
	for w := range set {
		l.disarmLocked(w)
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func waiterKeys(w *pollWaiter) []string {
	if len(w.topics) == 0 {
		return globalKey
	}
	return w.topics
}

func (l *live) subscribeFunc(fn func(Event)) func() { return l.subscribe(fn, nil) }

func (l *live) subscribe(fn func(Event), gap func(Gap)) func() {
	if fn == nil {
		fn = func(Event) {}
	}
	sub := &funcSub{fn: fn, gap: gap}
	l.subsMu.Lock()
	l.funcs = append(l.funcs[:len(l.funcs):len(l.funcs)], sub)
	l.subsMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			sub.gone.Store(true)
			l.subsMu.Lock()
			defer l.subsMu.Unlock()
			for i, s := range l.funcs {
				if s == sub {
					l.funcs = append(l.funcs[:i:i], l.funcs[i+1:]...)
					break
				}
			}
		})
	}
}

// hasSubscribers reports whether anything would receive a dispatch.
func (l *live) hasSubscribers() bool {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	return len(l.byTopic) > 0 || len(l.funcs) > 0 || len(l.waiters) > 0
}

// addStream registers s under each of its topics, or as a global stream.
func (l *live) addStream(s *stream) {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	for _, topic := range streamKeys(s) {
		set := l.byTopic[topic]
		if set == nil {
			set = make(map[*stream]struct{})
			l.byTopic[topic] = set
		}
		set[s] = struct{}{}
	}
}

func (l *live) removeStream(s *stream) {
	l.subsMu.Lock()
	defer l.subsMu.Unlock()
	for _, topic := range streamKeys(s) {
		set := l.byTopic[topic]
		delete(set, s)
		if len(set) == 0 {
			delete(l.byTopic, topic)
		}
	}
}

// globalKey is the byTopic key of global streams.
var globalKey = []string{""}

// streamKeys returns the byTopic keys s is registered under.
func streamKeys(s *stream) []string {
	if len(s.topics) == 0 {
		return globalKey
	}
	return s.topics
}

// dispatch hands rows above the live position to every subscriber and
// advances the position. l.mu must be held; rows must be ascending.
func (l *live) dispatch(rows []Event) {
	for len(rows) > 0 && rows[0].Sequence <= l.pos {
		rows = rows[1:]
	}
	if len(rows) == 0 {
		return
	}
	l.pollWin.add(l.pos, rows)
	l.pos = rows[len(rows)-1].Sequence
	l.newestAt = rows[len(rows)-1].CreatedAt
	l.subsMu.Lock()
	for i := range rows {
		ev := &rows[i]
		var le *liveEvent
		if ev.Topic == "" {
			for _, set := range l.byTopic {
				le = pushAll(set, ev, le)
			}
		} else {
			le = pushAll(l.byTopic[ev.Topic], ev, le)
			pushAll(l.byTopic[""], ev, le)
		}
		if len(l.waiters) > 0 {
			if ev.Topic == "" {
				for _, set := range l.waiters {
					l.wakeLocked(set)
				}
			} else {
				l.wakeLocked(l.waiters[ev.Topic])
				l.wakeLocked(l.waiters[""])
			}
		}
	}
	funcs := l.funcs
	l.subsMu.Unlock()
	for _, ev := range rows {
		for _, sub := range funcs {
			if !sub.gone.Load() {
				sub.fn(ev)
			}
		}
	}
}

// pushAll queues ev on every stream of set, encoding its frame (le) on first
// use, and returns le. A stream registered under several topics meets a
// broadcast in several sets: it is queued only the first time, since rows
// are dispatched in sequence order. The caller holds subsMu.
func pushAll(set map[*stream]struct{}, ev *Event, le *liveEvent) *liveEvent {
	for s := range set {
		if s.lastPushed >= ev.Sequence {
			continue
		}
		s.lastPushed = ev.Sequence
		if le == nil {
			le = &liveEvent{Event: *ev, frame: appendEventFrame(nil, *ev)}
		}
		s.push(le)
	}
	return le
}

// gap tells every subscriber that asked for gaps about g. l.mu must be held,
// so g reaches them in order with the events.
func (l *live) gap(g Gap) {
	l.subsMu.Lock()
	funcs := l.funcs
	l.subsMu.Unlock()
	for _, sub := range funcs {
		if sub.gap != nil && !sub.gone.Load() {
			sub.gap(g)
		}
	}
}

// catchUpPage is how many rows one log read brings while catching up.
const catchUpPage = 1000

// position returns the live position. Under catchMu it stays put until
// the caller moves it.
func (l *live) position() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pos
}

// deliver is live delivery's one path: the writer calls it with the rows
// it committed, the tail (see poll) with none and the head it read. It
// brings the live position up to after, reading from the log the rows
// another process committed below it, then dispatches rows, which must be
// every row with a sequence in (after, last row's sequence], ascending. It
// holds catchMu throughout, so deliveries never interleave, and takes mu
// only to dispatch and to move the position (see live).
//
// The two callers differ only in what they can do with a failed read. The
// writer's rows are committed: it reads until it reaches after, and turns
// rows it cannot read into a gap (GapUnreadable), so that its rows are
// delivered anyway. The tail (onePage) reads at most one page, returns
// the error to back off and retry, and is called again at once after a
// full page. It reports how many rows it read from the log, and, for the
// tail, the CreatedAt of the newest row it dispatched (zero if none).
func (h *EventHub) deliver(after int64, rows []Event, onePage bool) (n int, newest time.Time, err error) {
	h.live.catchMu.Lock()
	defer h.live.catchMu.Unlock()
	pos := h.live.position()
	if len(rows) == 0 && after == pos {
		return 0, time.Time{}, nil // an idle tail poll: nothing new
	}
	if after < pos {
		// Rows at or below the live position: the other caller delivered
		// them already (a publish moved the position past the head the
		// tail read, or the tail read the writer's rows), or the log was
		// reset under the hub. The head, never below the position
		// otherwise, tells.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		head, err := h.store.Head(ctx)
		cancel()
		if err != nil && onePage {
			return 0, time.Time{}, err
		}
		h.live.mu.Lock()
		switch {
		case err != nil:
			h.logger.Error("replayd: cannot read the head to tell a reset log from rows already delivered",
				"after", after, "livePosition", h.live.pos, "err", err)
		case head < h.live.pos:
			h.logger.Warn("replayd: the log's head is below the live position: the log was reset or replaced; reconnecting streams",
				"head", head, "livePosition", h.live.pos)
			h.logReset(min(after, head))
		}
		h.live.mu.Unlock()
	}
	if !h.live.hasSubscribers() {
		// Nobody to deliver to: skip reading other writers' rows. A
		// subscriber that arrives later reads the head after subscribing,
		// so rows up to here reach it by replay.
		h.live.mu.Lock()
		// The poll window still takes rows known to be every row above
		// where they start.
		from := max(h.live.pos, after)
		for len(rows) > 0 && rows[0].Sequence <= from {
			rows = rows[1:]
		}
		h.live.pollWin.add(from, rows)
		h.live.pos = max(h.live.pos, after)
		if k := len(rows); k > 0 {
			h.live.pos = max(h.live.pos, rows[k-1].Sequence)
		}
		h.live.mu.Unlock()
		return 0, time.Time{}, nil
	}
	if onePage { // the tail measures its lag from what this call dispatches
		h.live.mu.Lock()
		h.live.newestAt = time.Time{}
		h.live.mu.Unlock()
	}
	for pos := h.live.position(); pos < after; pos = h.live.position() {
		read, err := h.catchUp(after, catchUpPage)
		n += read
		switch {
		case onePage && err != nil:
			return n, time.Time{}, err
		case onePage:
		case err != nil:
			// The rows in between cannot be read, so they cannot be
			// delivered in order: make every stream resume from the log.
			h.live.mu.Lock()
			h.logger.Error("replayd: cannot read rows committed by another process; reconnecting streams",
				"from", h.live.pos+1, "through", after, "err", err)
			h.resync()
			h.live.pollWin.reset()
			h.live.gap(Gap{Reason: GapUnreadable, After: h.live.pos, From: h.live.pos + 1, Through: after})
			h.live.pos = after
			h.live.mu.Unlock()
			continue
		default:
			continue
		}
		break
	}
	if len(rows) > 0 {
		h.live.mu.Lock()
		h.live.dispatch(rows)
		h.metrics.flushLiveFrames()
		h.live.mu.Unlock()
		return n, time.Time{}, nil
	}
	h.live.mu.Lock()
	defer h.live.mu.Unlock()
	return n, h.live.newestAt, nil
}

// catchUp reads at most limit rows above the live position, stopping at
// through, and dispatches them. It reports how many rows it read. The caller
// holds h.live.catchMu, not h.live.mu: the read is made without it, and
// the dispatch under it.
func (h *EventHub) catchUp(through int64, limit int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from := h.live.position()
	page, err := h.store.Read(ctx, storage.ReadRequest{After: from, Through: through, Limit: limit})
	if err != nil {
		return 0, err
	}
	h.live.mu.Lock()
	defer h.live.mu.Unlock()
	if page.Foreign {
		// The live position is a sequence the log never issued: it was
		// replaced under the hub (restored in place from a backup, say)
		// and its head raised past the lost history (the sequence floor),
		// which the rows above belong to no more. As for a head below the
		// position: every stream ends and resumes with unknown_cursor.
		h.logger.Warn("replayd: the live position is a sequence the log never issued: the log was replaced; reconnecting streams",
			"head", page.Head, "livePosition", from)
		h.logReset(min(through, page.Head))
		return 0, nil
	}
	if mark := page.Watermark; mark > from {
		// Rows above the live position were pruned before they were
		// delivered. Every row up to mark is gone, so the hole ends there,
		// or at through, beyond which this call delivers nothing.
		hole := min(mark, through)
		h.logger.Warn("replayd: rows were pruned before live delivery; reconnecting streams",
			"from", from+1, "through", hole)
		h.resync()
		h.live.pollWin.reset()
		h.live.gap(Gap{Reason: GapPruned, After: from, From: from + 1, Through: hole})
		h.live.pos = hole
	}
	h.live.dispatch(page.Events)
	h.metrics.flushLiveFrames()
	if !page.More && h.live.pos < through {
		// Every row up to through is read, even when through itself has no
		// row (a sequence spent by a duplicate event id, or pruned): the
		// position may move there.
		h.live.pollWin.extend(h.live.pos, through)
		h.live.pos = through
	}
	return len(page.Events), nil
}

// logReset handles a head below the live position, or a live position the
// log finds foreign: the log was reset or replaced from outside, and its
// sequences start again (or, raised by the sequence floor, go on above the
// lost history's). Like a cursor above the head (an unknown_cursor gap),
// every stream ends, so its client reconnects, is told by an
// unknown_cursor gap and goes on from the new head; gap subscribers are
// told the same; the live position moves to through, above which rows are
// delivered again. The caller holds h.live.catchMu and h.live.mu, and has
// logged why.
func (h *EventHub) logReset(through int64) {
	h.resync()
	h.live.pollWin.reset()
	h.live.gap(Gap{Reason: GapUnknownCursor, After: h.live.pos, From: 1, Through: through})
	h.live.pos = through
}

// resync ends every open stream so that its client reconnects and resumes
// from the log, where the guarantee is kept by replay and gaps.
func (h *EventHub) resync() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.streams {
		s.kill()
	}
}
