package live

import (
	"sync"
	"sync/atomic"

	"github.com/replayd/replayd/storage"
)

// The subscriber sets: streams by topic, callbacks, waiting long polls.
// Each is guarded by subsMu; dispatch reads them under it.

type funcSub struct {
	fn   func(storage.Event)
	gap  func(Gap) // nil: a plain subscription
	gone atomic.Bool
}

// Subscribe registers fn for every row dispatched from now on, and gap
// (if not nil) for every hole, until the returned function is called; see
// the root package's EventHub.SubscribeWithGaps. Both run under mu.
func (h *Hub) Subscribe(fn func(storage.Event), gap func(Gap)) (unsubscribe func()) {
	if fn == nil {
		fn = func(storage.Event) {}
	}
	sub := &funcSub{fn: fn, gap: gap}
	h.subsMu.Lock()
	h.funcs = append(h.funcs[:len(h.funcs):len(h.funcs)], sub)
	h.subsMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			sub.gone.Store(true)
			h.subsMu.Lock()
			defer h.subsMu.Unlock()
			for i, s := range h.funcs {
				if s == sub {
					h.funcs = append(h.funcs[:i:i], h.funcs[i+1:]...)
					break
				}
			}
		})
	}
}

// hasSubscribers reports whether anything would receive a dispatch.
func (h *Hub) hasSubscribers() bool {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	return len(h.byTopic) > 0 || len(h.funcs) > 0 || len(h.waiters) > 0
}

// AddStream subscribes s under each of its topics, or as a global stream:
// every row of its scope dispatched from now on is queued on it.
func (h *Hub) AddStream(s *Stream) {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	for _, topic := range streamKeys(s) {
		set := h.byTopic[topic]
		if set == nil {
			set = make(map[*Stream]struct{})
			h.byTopic[topic] = set
		}
		set[s] = struct{}{}
	}
}

// RemoveStream undoes AddStream.
func (h *Hub) RemoveStream(s *Stream) {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	for _, topic := range streamKeys(s) {
		set := h.byTopic[topic]
		delete(set, s)
		if len(set) == 0 {
			delete(h.byTopic, topic)
		}
	}
}

// globalKey is the byTopic and waiters key of global subscribers.
var globalKey = []string{""}

// streamKeys returns the byTopic keys s is registered under.
func streamKeys(s *Stream) []string {
	if len(s.topics) == 0 {
		return globalKey
	}
	return s.topics
}

// Track adds s to the open streams, which Resync and Close end; false if
// the Hub is closed. Untrack it once it ended.
func (h *Hub) Track(s *Stream) bool {
	h.streamsMu.Lock()
	defer h.streamsMu.Unlock()
	if h.closed {
		return false
	}
	h.open[s] = struct{}{}
	return true
}

// Untrack removes s from the open streams.
func (h *Hub) Untrack(s *Stream) {
	h.streamsMu.Lock()
	defer h.streamsMu.Unlock()
	delete(h.open, s)
}

// Close ends every open stream, and every stream tracked later.
func (h *Hub) Close() {
	h.streamsMu.Lock()
	defer h.streamsMu.Unlock()
	h.closed = true
	for s := range h.open {
		s.Kill()
	}
}

// A Waiter is a long poll waiting for an event of its scope. Dispatch
// wakes it at most once per registration: it is unregistered as it is
// woken, and registers again (AddWaiter) before its next read of the log.
type Waiter struct {
	topics []string
	wake   chan struct{} // capacity 1; sent to by dispatch, read by the poll
	armed  bool          // registered; guarded by Hub.subsMu
}

// NewWaiter returns a waiter for events of topics (none: every event).
func NewWaiter(topics []string) *Waiter {
	return &Waiter{topics: topics, wake: make(chan struct{}, 1)}
}

// Woken receives once the waiter is woken.
func (w *Waiter) Woken() <-chan struct{} { return w.wake }

// AddWaiter registers w: the next row of its scope dispatched wakes it.
func (h *Hub) AddWaiter(w *Waiter) {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	if w.armed {
		return
	}
	w.armed = true
	for _, topic := range waiterKeys(w) {
		set := h.waiters[topic]
		if set == nil {
			set = make(map[*Waiter]struct{})
			h.waiters[topic] = set
		}
		set[w] = struct{}{}
	}
}

// RemoveWaiter unregisters w if it is registered.
func (h *Hub) RemoveWaiter(w *Waiter) {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	h.disarmLocked(w)
}

func (h *Hub) disarmLocked(w *Waiter) {
	if !w.armed {
		return
	}
	w.armed = false
	for _, topic := range waiterKeys(w) {
		set := h.waiters[topic]
		delete(set, w)
		if len(set) == 0 {
			delete(h.waiters, topic)
		}
	}
}

// wakeLocked wakes, and unregisters, every waiter of set. The caller
// holds subsMu.
func (h *Hub) wakeLocked(set map[*Waiter]struct{}) {
	for w := range set {
		h.disarmLocked(w)
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func waiterKeys(w *Waiter) []string {
	if len(w.topics) == 0 {
		return globalKey
	}
	return w.topics
}
