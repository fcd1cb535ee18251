package replayd

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// PollHandler returns the poll endpoint: the log, cursors and gaps of the
// SSE endpoint as plain JSON, for clients that cannot hold a stream open.
// Mount it beside the SSE endpoint:
//
//	mux.Handle("/poll", hub.PollHandler())
//
// GET /poll?topic=a&cursor=17&limit=100&wait=25 answers the oldest events of
// the scope above the cursor, at most limit of them, with the cursor to send
// next; with wait > 0 a request that has nothing to answer is held until an
// event of its scope is committed, for at most wait seconds
// (PollOptions.MaxWait). PROTOCOL.md describes the request and the answer.
func (h *EventHub) PollHandler() http.Handler { return (*pollHandler)(h) }

type pollHandler EventHub

// pollAnswer is a poll's JSON answer.
type pollAnswer struct {
	Topics []string    `json:"topics"`
	Cursor int64       `json:"cursor"`
	Head   int64       `json:"head"`
	More   bool        `json:"more"`
	Gap    *gap        `json:"gap"`
	Events []pollEvent `json:"events"`
}

type pollEvent struct {
	ID    int64           `json:"id"`
	Type  string          `json:"type"`
	Topic *string         `json:"topic"` // null for a broadcast
	Data  json.RawMessage `json:"data"`
}

func (ph *pollHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := (*EventHub)(ph)
	switch r.Method {
	case http.MethodGet:
	case http.MethodOptions:
		h.preflight(w, r, "GET, OPTIONS")
		return
	default:
		w.Header().Set("Allow", "GET, OPTIONS")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	// A cross-origin page's script must be able to read Retry-After (503).
	w.Header().Set("Access-Control-Expose-Headers", "Retry-After")
	query, topics, release, ok := h.admit(w, r, transportPoll)
	if !ok {
		return
	}
	defer release()
	p, err := parsePollParams(query, h.opts.Poll.MaxLimit, h.opts.Poll.MaxWait)
	if err != nil {
		h.metrics.refused(refusedBadRequest)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ans, status := h.longPoll(r.Context(), w, r, topics, p)
	if status == 0 {
		return // answered already (overload), or the client left
	}
	if ans.Topics == nil {
		ans.Topics = []string{}
	}
	if ans.Gap != nil {
		h.metrics.gap(ans.Gap.Reason)
	}
	h.metrics.replayed(transportPoll, len(ans.Events))
	buf := pollBuffers.Get().(*[]byte)
	defer putPollBuffer(buf)
	body, err := ans.appendJSON((*buf)[:0])
	*buf = body
	if err != nil {
		h.logger.Error("replayd: encode a poll answer", "topics", topics, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(body)
}

// pollBuffers holds the buffers poll answers are encoded into; a buffer
// grown past maxPooledPollBuffer is dropped rather than kept.
var pollBuffers = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledPollBuffer = 64 << 10

func putPollBuffer(buf *[]byte) {
	if cap(*buf) <= maxPooledPollBuffer {
		pollBuffers.Put(buf)
	}
}

// appendJSON appends the answer exactly as encoding/json.Marshal encodes
// it (TestPollAnswerJSON holds the two to the same bytes), without
// reflection; the gap, rare, and any string or payload that needs escaping
// are still encoded by encoding/json.
func (a *pollAnswer) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"topics":`...)
	if a.Topics == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, t := range a.Topics {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, t)
		}
		b = append(b, ']')
	}
	b = append(b, `,"cursor":`...)
	b = strconv.AppendInt(b, a.Cursor, 10)
	b = append(b, `,"head":`...)
	b = strconv.AppendInt(b, a.Head, 10)
	b = append(b, `,"more":`...)
	b = strconv.AppendBool(b, a.More)
	b = append(b, `,"gap":`...)
	if a.Gap == nil {
		b = append(b, "null"...)
	} else {
		enc, err := json.Marshal(a.Gap)
		if err != nil {
			return b, err
		}
		b = append(b, enc...)
	}
	b = append(b, `,"events":`...)
	if a.Events == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range a.Events {
			e := &a.Events[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = strconv.AppendInt(b, e.ID, 10)
			b = append(b, `,"type":`...)
			b = appendJSONString(b, e.Type)
			b = append(b, `,"topic":`...)
			if e.Topic == nil {
				b = append(b, "null"...)
			} else {
				b = appendJSONString(b, *e.Topic)
			}
			b = append(b, `,"data":`...)
			var err error
			if b, err = appendJSONRaw(b, e.Data); err != nil {
				return b, err
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

// longPoll builds the answer to one poll request, holding a long poll until an
// event of its scope is committed above its cursor, wait runs out, its
// access is revoked (WithRevocation), the client leaves or the hub closes.
// A status of 0 means the answer, if any, was written already.
func (h *EventHub) longPoll(ctx context.Context, w http.ResponseWriter, r *http.Request, topics []string, p pollParams) (pollAnswer, int) {
	ans := pollAnswer{Topics: topics, Events: []pollEvent{}}
	var waiter *pollWaiter
	if p.wait > 0 {
		// Registered before the log is read: an event committed after the
		// read wakes the wait; one committed before is in the read.
		waiter = &pollWaiter{topics: topics, wake: make(chan struct{}, 1)}
		h.live.addWaiter(waiter)
		defer h.live.removeWaiter(waiter)
	}
	var (
		deadline   *time.Timer
		releaseCap func()
		revoked    <-chan struct{} // closed once the request's access is revoked (WithRevocation)
		unrevoke   func()
	)
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
		if unrevoke != nil {
			unrevoke()
		}
		if releaseCap != nil {
			releaseCap()
			h.metrics.connClosed(transportPoll)
		}
	}()
	cursor, fresh := p.cursor, p.fresh
	for {
		// A revocation is checked before each read and after it, before
		// anything read is answered: its watch runs elsewhere, and only
		// once the poll waits.
		if isRevoked(ctx) {
			return h.revokedPoll(w, ans, releaseCap != nil)
		}
		pg, err := h.readPoll(ctx, topics, cursor, fresh, p.limit)
		if isRevoked(ctx) {
			return h.revokedPoll(w, ans, releaseCap != nil)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ans, 0
			}
			if err == ErrClosed {
				return ans, http.StatusServiceUnavailable
			}
			h.logger.Error("replayd: read the log for a poll", "topics", topics, "remote", r.RemoteAddr, "err", err)
			return ans, http.StatusServiceUnavailable
		}
		ans.Head = pg.head
		if fresh {
			cursor, fresh = pg.head, false // held from the head, like any long poll
		}
		ans.Cursor = cursor
		switch {
		case cursor > pg.head || pg.foreign:
			ans.Gap = &gap{Reason: reasonUnknownCursor, ResumedFrom: ptr(cursor), ReplayLimit: p.limit}
			ans.Cursor = pg.head
			return ans, http.StatusOK
		case pg.watermark > cursor:
			ans.Gap = &gap{
				Reason:        reasonPruned,
				ResumedFrom:   ptr(cursor),
				MissedFrom:    ptr(cursor + 1),
				MissedThrough: ptr(pg.watermark),
				ReplayLimit:   p.limit,
			}
		}
		if len(pg.events) > 0 || ans.Gap != nil || waiter == nil {
			ans.Events = make([]pollEvent, 0, len(pg.events))
			for i := range pg.events {
				ev := &pg.events[i]
				pe := pollEvent{ID: ev.Sequence, Type: ev.Type, Data: ev.Payload}
				if ev.Topic != "" {
					pe.Topic = &ev.Topic
				}
				ans.Events = append(ans.Events, pe)
			}
			if n := len(pg.events); n > 0 {
				ans.Cursor = pg.events[n-1].Sequence
			}
			ans.More = pg.more
			return ans, http.StatusOK
		}
		// Nothing to answer yet: wait, holding a connection slot.
		if releaseCap == nil {
			var ok bool
			if releaseCap, ok = h.acquireSlot(); !ok {
				h.overloaded(w, r, transportPoll)
				return ans, 0
			}
			h.metrics.connOpened(transportPoll)
			deadline = time.NewTimer(p.wait)
			revoked, unrevoke = revokedChan(ctx)
		}
		select {
		case <-waiter.wake:
			h.live.addWaiter(waiter) // before the next read, as above
		case <-deadline.C:
			return ans, http.StatusOK
		case <-revoked:
			// Answered as if the wait ran out: the client polls again,
			// and Authorize decides again.
			return ans, http.StatusOK
		case <-h.done:
			return ans, http.StatusOK
		case <-ctx.Done():
			return ans, 0
		}
	}
}

// revokedPoll answers a poll whose access was revoked (WithRevocation)
// before its answer was built. One that waited is answered as if its wait
// had run out: ans, with no events, holds what its last read answered
// before the wait. One revoked before it waited is refused with 403, as by
// Authorize; nothing it read is answered.
func (h *EventHub) revokedPoll(w http.ResponseWriter, ans pollAnswer, waited bool) (pollAnswer, int) {
	if waited {
		return ans, http.StatusOK
	}
	h.metrics.refused(refusedForbidden)
	http.Error(w, "access revoked", http.StatusForbidden)
	return ans, 0
}

// readPoll reads a poll's page under a read slot: for a fresh request only
// the head counts, and nothing above it is returned.
func (h *EventHub) readPoll(ctx context.Context, topics []string, cursor int64, fresh bool, limit int) (page, error) {
	if !h.acquireRead(ctx) {
		if ctx.Err() != nil {
			return page{}, ctx.Err()
		}
		return page{}, ErrClosed
	}
	defer h.releaseRead()
	if fresh {
		cursor = maxSequence // read the head and the watermark only
	}
	pg, err := h.store.read(ctx, topics, cursor, limit)
	if fresh {
		pg.watermark, pg.foreign = 0, false // a fresh request is owed no gap
	}
	return pg, err
}
