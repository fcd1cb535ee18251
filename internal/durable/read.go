package durable

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/storage"
)

// GET reads a stream: catch-up (a page of what follows the offset),
// live=long-poll (that, or wait for it) or live=sse (read.go resolves the
// offset for all three; longpoll.go and sse.go wait).

// Pages are cut as the poll transport cuts them.
const (
	pageEvents = 1000
	pageBytes  = 4 << 20
)

// parseQuery parses a raw query strictly: a query that does not parse is
// refused rather than half read.
func parseQuery(raw string) (url.Values, error) { return url.ParseQuery(raw) }

// view is a resolved read: the stream, the position read after, the
// events that follow it (up to a page), and the stream's tail.
type view struct {
	m      *meta
	topic  string
	after  int64
	events []storage.Event
	more   bool // more events follow the page
	tail   int64
}

// upToDate reports whether the page reaches the stream's tail.
func (v *view) upToDate() bool { return !v.more }

// next is the offset after the page: its last event, or where it started.
func (v *view) next() int64 {
	if n := len(v.events); n > 0 {
		return v.events[n-1].Sequence
	}
	return v.after
}

// readAt reads topic's page after the offset (kind, seq), checking that it
// is a position of the stream: a *refusal for a missing or expired stream
// (404), a deleted one (410), or an offset that is not one of its
// positions (410).
func (h *Handler) readAt(ctx context.Context, topic string, kind offsetKind, seq int64) (*view, error) {
	req := storage.StreamReadRequest{Topic: topic, After: seq, Limit: pageEvents, MaxBytes: pageBytes}
	if kind != atSeq {
		req.After, req.Limit, req.MaxBytes = 0, 1, 1 // only the record and the tail, first
	}
	page, err := h.Store.ReadStream(ctx, req)
	if err != nil {
		return nil, err
	}
	m, err := h.alive(page)
	if err != nil {
		return nil, err
	}
	tail := m.tail(page.Last)
	switch kind {
	case atTail:
		return &view{m: m, topic: topic, after: tail, tail: tail}, nil
	case atStart:
		return h.readFrom(ctx, topic, m, 0, m.start(), nil, tail)
	}
	segs := m.segments(topic)
	own := len(segs) - 1
	if seq > m.Base {
		// In the stream's own range: page was read there.
		if ref := position(m, page, seq, tail); ref != nil {
			return nil, ref
		}
		return h.readFrom(ctx, topic, m, own, seq, &page, tail)
	}
	for i, sg := range segs {
		if seq == sg.Lo {
			// A segment's start is a position, unless retention deleted
			// what follows it: then 410, never the rest as if contiguous.
			first := &page
			if i != own {
				probe, err := h.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: sg.Topic, After: seq, Through: sg.Hi, Limit: pageEvents, MaxBytes: pageBytes})
				if err != nil {
					return nil, err
				}
				first = &probe
			}
			if first.Watermark > seq {
				return nil, goneOffset(*first, seq)
			}
			return h.readFrom(ctx, topic, m, i, seq, first, tail)
		}
	}
	for i, sg := range m.Chain {
		if sg.Lo < seq && seq <= sg.Hi {
			probe, err := h.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: sg.Topic, After: seq, Through: sg.Hi, Limit: pageEvents, MaxBytes: pageBytes})
			if err != nil {
				return nil, err
			}
			if !probe.At {
				return nil, goneOffset(probe, seq)
			}
			return h.readFrom(ctx, topic, m, i, seq, &probe, tail)
		}
	}
	// In none of the stream's segments: another stream's, or an earlier
	// incarnation's, whose events the sweep may have pruned (the topic's
	// watermark above seq says nothing of this stream).
	page.Watermark = 0
	return nil, goneOffset(page, seq)
}

// readAfter reads the page of m's stream after a position it already
// checked (the offset after a page it answered).
func (h *Handler) readAfter(ctx context.Context, topic string, m *meta, after int64) (*view, error) {
	page, err := h.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: topic, After: after, Limit: pageEvents, MaxBytes: pageBytes})
	if err != nil {
		return nil, err
	}
	m2, err := h.alive(page)
	if err != nil {
		return nil, err
	}
	if m2.Base != m.Base {
		return nil, refuse(http.StatusNotFound, "stream not found") // deleted and created again meanwhile
	}
	tail := m2.tail(page.Last)
	segs := m2.segments(topic)
	if after >= m2.Base {
		return h.readFrom(ctx, topic, m2, len(segs)-1, after, &page, tail)
	}
	for i := len(m2.Chain) - 1; i >= 0; i-- {
		if after >= m2.Chain[i].Lo {
			return h.readFrom(ctx, topic, m2, i, after, nil, tail)
		}
	}
	return h.readFrom(ctx, topic, m2, 0, after, nil, tail)
}

// readFrom reads m's segments from segment i on, after the position
// after: a page of their events, in order. first, when set, is segment
// i's page already read after it.
func (h *Handler) readFrom(ctx context.Context, topic string, m *meta, i int, after int64, first *storage.StreamPage, tail int64) (*view, error) {
	v := &view{m: m, topic: topic, after: after, tail: tail}
	segs := m.segments(topic)
	left, size := pageEvents, pageBytes
	for ; i < len(segs); i++ {
		sg := segs[i]
		from := max(after, sg.Lo)
		var page storage.StreamPage
		if first != nil && from == after {
			page, first = *first, nil
		} else {
			var err error
			page, err = h.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: sg.Topic, After: from, Through: sg.Hi, Limit: left, MaxBytes: size})
			if err != nil {
				return nil, err
			}
		}
		for _, ev := range page.Events {
			if sg.Hi != 0 && ev.Sequence > sg.Hi {
				break // a page read before its bound was known (a closed stream's own)
			}
			if left == 0 || size <= 0 {
				v.more = true
				return v, nil
			}
			v.events = append(v.events, ev)
			left--
			size -= len(ev.Payload)
		}
		if page.More && (sg.Hi == 0 || page.Events[len(page.Events)-1].Sequence < sg.Hi) {
			v.more = true
			return v, nil
		}
	}
	return v, nil
}

// alive decodes a page's stream: a refusal when it is missing or expired
// (404) or deleted while forks read it (410).
func (h *Handler) alive(page storage.StreamPage) (*meta, error) {
	if !page.Found {
		return nil, refuse(http.StatusNotFound, "stream not found")
	}
	m, err := decodeMeta(page.Record)
	if err != nil {
		return nil, err
	}
	switch m.state(h.Now()) {
	case absent:
		return nil, refuse(http.StatusNotFound, "stream not found")
	case gone:
		return nil, refuse(http.StatusGone, "the stream was deleted")
	}
	return m, nil
}

// position checks that o, in m's own range, is a position of its stream
// (page was read after o): an event of its topic up to its tail. Anything
// else is gone: beyond the tail, foreign to the log (a restored or
// replaced log), below what retention kept, or not the stream's. Never
// data as if contiguous.
func position(m *meta, page storage.StreamPage, o, tail int64) *refusal {
	switch {
	case page.Foreign || o > page.Head:
		return goneOffset(page, o)
	case o > tail:
		return &refusal{status: http.StatusGone, code: "unknown_offset", msg: "the offset is beyond the stream's tail"}
	case page.At:
		return nil
	}
	return goneOffset(page, o)
}

// goneOffset is the 410 for an offset that is not a position of the
// stream, page having been read after it in the topic it would be of.
func goneOffset(page storage.StreamPage, o int64) *refusal {
	gone := func(code, msg string) *refusal {
		return &refusal{status: http.StatusGone, code: code, msg: msg}
	}
	switch {
	case page.Foreign || o > page.Head:
		return gone("unknown_offset", "the log never issued this offset (a restored or replaced log): read again from -1")
	case o <= page.Watermark:
		return gone("retention", "retention deleted what follows this offset: read again from -1")
	}
	return gone("unknown_offset", "the offset is not of this stream (another stream's, or an earlier incarnation's): read again from -1")
}

func (h *Handler) read(w http.ResponseWriter, r *http.Request, topic string) {
	q := r.URL.Query()
	offs, given := q["offset"]
	if len(offs) > 1 {
		httpError(w, http.StatusBadRequest, "offset given more than once")
		return
	}
	mode := q.Get("live")
	if (mode == "long-poll" || mode == "sse") && !given {
		httpError(w, http.StatusBadRequest, "live="+mode+" needs an offset")
		return
	}
	kind, seq := atStart, int64(0)
	if given {
		var ok bool
		if kind, seq, ok = parseOffset(offs[0]); !ok {
			httpError(w, http.StatusBadRequest, "invalid offset: -1, now, or an offset this server gave")
			return
		}
	}
	ctx := r.Context()
	var waiter *live.Waiter
	if (mode == "long-poll" || mode == "sse") && h.Live != nil {
		// Registered before the first read: an append committed after it
		// wakes the wait; one committed before is in the read.
		waiter = live.NewWaiter([]string{topic})
		h.Live.AddWaiter(waiter)
		defer h.Live.RemoveWaiter(waiter)
	}
	v, err := h.readAt(ctx, topic, kind, seq)
	if err != nil {
		h.answerErr(w, r, topic, err)
		return
	}
	h.touch(ctx, topic, v.m)
	if h.Reading != nil {
		if done := h.Reading(topic); done != nil {
			defer done() // a long poll and an SSE stream read for as long as they are open
		}
	}
	switch mode {
	case "sse":
		h.sse(w, r, topic, v, waiter)
		return
	case "long-poll":
		h.longPoll(w, r, topic, v, waiter)
		return
	}
	hd := w.Header()
	if kind == atTail {
		hd.Set("Cache-Control", "no-store")
		h.writePage(w, r, v, false, "")
		return
	}
	h.writePage(w, r, v, true, offs0(offs))
}

func offs0(offs []string) string {
	if len(offs) == 0 {
		return offsetStart
	}
	return offs[0]
}

// writePage answers a page: 200 with its data and headers; with etag, an
// ETag and 304 for a matching If-None-Match.
func (h *Handler) writePage(w http.ResponseWriter, r *http.Request, v *view, etag bool, from string) {
	hd := w.Header()
	hd.Set("Content-Type", v.m.ContentType)
	next := v.next()
	hd.Set(hNextOffset, formatOffset(next))
	up := v.upToDate()
	if up {
		hd.Set(hUpToDate, "true")
	}
	closed := v.m.Closed && up && next >= v.m.ClosedAt
	if closed {
		hd.Set(hClosed, "true")
	}
	if etag {
		tag := `"` + strconv.FormatInt(v.m.Base, 10) + ":" + from + ":" + formatOffset(next)
		if closed {
			tag += ":c"
		}
		tag += `"`
		hd.Set("ETag", tag)
		if inm := r.Header.Get("If-None-Match"); inm != "" && inm == tag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	body := appendBody(nil, encodingOf(v.m.ContentType), v.events)
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}

// touch slides a stream's TTL on a read: at most one write a second per
// stream (ten per TTL, for a TTL under 10 s), through a stream transaction.
func (h *Handler) touch(ctx context.Context, topic string, m *meta) {
	if m.TTL == nil || h.Now().UnixMilli()-m.Access < min(1000, *m.TTL*100) {
		return
	}
	err := h.update(ctx, []string{topic}, func(t *txn) error {
		cur, st, err := t.stream(ctx, topic)
		if err != nil || st != alive || cur.Base != m.Base {
			return err
		}
		cur.Access = t.now.UnixMilli()
		return t.put(ctx, topic, cur)
	})
	if err != nil && ctx.Err() == nil {
		h.Logger.Warn("replayd: durable streams: slide a stream's TTL", "topic", topic, "err", err)
	}
}
