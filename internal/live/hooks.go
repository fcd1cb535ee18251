package live

import "github.com/replayd/replayd/storage"

// Hooks for the root package's tests, which drive live delivery through a
// whole hub. Nothing else calls them.

// HoldDispatch takes the dispatch lock (Hub.mu), stalling every delivery
// at its next dispatch, until release is called.
func (h *Hub) HoldDispatch() (release func()) {
	h.mu.Lock()
	return h.mu.Unlock
}

// TryHoldDispatch is HoldDispatch if the lock is free; ok false if it is
// held (a delivery is dispatching, or reading the log under it).
func (h *Hub) TryHoldDispatch() (release func(), ok bool) {
	if !h.mu.TryLock() {
		return nil, false
	}
	return h.mu.Unlock, true
}

// StreamsOf returns how many streams are subscribed under topic ("":
// global streams).
func (h *Hub) StreamsOf(topic string) int {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	return len(h.byTopic[topic])
}

// WaiterSets returns how many scopes have a waiter registered.
func (h *Hub) WaiterSets() int {
	h.subsMu.Lock()
	defer h.subsMu.Unlock()
	return len(h.waiters)
}

// OpenStreams returns how many streams are tracked (see Track).
func (h *Hub) OpenStreams() int {
	h.streamsMu.Lock()
	defer h.streamsMu.Unlock()
	return len(h.open)
}

// SetWindowOff makes every poll read the log (off), or the window answer
// again.
func (h *Hub) SetWindowOff(off bool) { h.window.off.Store(off) }

// WindowAnswer is the window's answer to req given a probe that found
// head and the watermark mark (see window.answer).
func (h *Hub) WindowAnswer(req storage.ReadRequest, head, mark int64) (storage.Page, bool) {
	pg, _, ok := h.window.answer(req, head, mark, h.encodesAsIs)
	return pg, ok
}

// SetProbeHook sets a function each probe calls once it has read, before
// its polls are told; set it before any poll.
func (h *Hub) SetProbeHook(f func()) { h.probe.hook = f }

// ProbeWaiting reports whether a poll waits for a probe that has not
// started.
func (h *Hub) ProbeWaiting() bool {
	p := &h.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending != nil && p.pending != p.last
}
