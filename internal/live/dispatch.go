package live

import "github.com/replayd/replayd/storage"

// dispatch hands rows above the live position to every subscriber and
// advances the position. h.mu must be held; rows must be ascending.
func (h *Hub) dispatch(rows []storage.Event) {
	for len(rows) > 0 && rows[0].Sequence <= h.pos {
		rows = rows[1:]
	}
	if len(rows) == 0 {
		return
	}
	h.window.add(h.pos, rows)
	h.pos = rows[len(rows)-1].Sequence
	h.newestAt = rows[len(rows)-1].CreatedAt
	h.subsMu.Lock()
	for i := range rows {
		ev := &rows[i]
		var f *Frame
		if ev.Topic == "" {
			for _, set := range h.byTopic {
				f = h.pushAll(set, ev, f)
			}
		} else {
			f = h.pushAll(h.byTopic[ev.Topic], ev, f)
			h.pushAll(h.byTopic[""], ev, f)
		}
		if len(h.waiters) > 0 {
			if ev.Topic == "" {
				for _, set := range h.waiters {
					h.wakeLocked(set)
				}
			} else {
				h.wakeLocked(h.waiters[ev.Topic])
				h.wakeLocked(h.waiters[""])
			}
		}
	}
	funcs := h.funcs
	h.subsMu.Unlock()
	for _, ev := range rows {
		for _, sub := range funcs {
			if !sub.gone.Load() {
				sub.fn(ev)
			}
		}
	}
}

// pushAll queues ev on every stream of set, encoding its frame (f) on first
// use, and returns f. A stream registered under several topics meets a
// broadcast in several sets: it is queued only the first time, since rows
// are dispatched in sequence order. The caller holds mu and subsMu.
func (h *Hub) pushAll(set map[*Stream]struct{}, ev *storage.Event, f *Frame) *Frame {
	for s := range set {
		if s.lastPushed >= ev.Sequence {
			continue
		}
		s.lastPushed = ev.Sequence
		if f == nil {
			f = &Frame{Sequence: ev.Sequence, Bytes: AppendEventFrame(nil, *ev)}
		}
		switch s.push(f) {
		case pushQueued:
			h.pending++
		case pushCut:
			h.sink.SlowConsumerCut()
		}
	}
	return f
}

// flushFrames reports the frames queued since the last call; h.mu must be
// held.
func (h *Hub) flushFrames() {
	if h.pending > 0 {
		h.sink.FramesQueued(h.pending)
		h.pending = 0
	}
}

// notifyGap tells every subscriber that asked for gaps about g. h.mu must
// be held, so g reaches them in order with the events.
func (h *Hub) notifyGap(g Gap) {
	h.subsMu.Lock()
	funcs := h.funcs
	h.subsMu.Unlock()
	for _, sub := range funcs {
		if sub.gap != nil && !sub.gone.Load() {
			sub.gap(g)
		}
	}
}
