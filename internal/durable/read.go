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

// view is a resolved read: the stream, the position read after, and the
// page read there.
type view struct {
	m     *meta
	after int64
	page  storage.StreamPage
	tail  int64
}

// upToDate reports whether the page reaches the stream's tail.
func (v *view) upToDate() bool { return !v.page.More }

// next is the offset after the page: its last event, or where it started.
func (v *view) next() int64 {
	if n := len(v.page.Events); n > 0 {
		return v.page.Events[n-1].Sequence
	}
	return v.after
}

// readAt reads topic's page after the offset (kind, seq), checking that it
// is a position of the stream: a *refusal for a missing or expired stream
// (404) or an offset that is not one of its positions (410).
func (h *Handler) readAt(ctx context.Context, topic string, kind offsetKind, seq int64) (*view, error) {
	after := seq
	if kind != atSeq {
		after = 0
	}
	limit, size := pageEvents, pageBytes
	if kind != atSeq {
		limit, size = 1, 1 // only the record and the tail, first
	}
	page, err := h.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: topic, After: after, Limit: limit, MaxBytes: size})
	if err != nil {
		return nil, err
	}
	m, ref, err := h.live(page)
	if err != nil || ref != nil {
		if ref != nil {
			return nil, ref
		}
		return nil, err
	}
	switch kind {
	case atTail:
		tail := m.tail(page.Last)
		return &view{m: m, after: tail, tail: tail, page: storage.StreamPage{Record: page.Record, Found: true, Last: page.Last, Head: page.Head}}, nil
	case atStart:
		return h.readAfter(ctx, topic, m, m.Base)
	}
	if ref := position(m, page, seq); ref != nil {
		return nil, ref
	}
	v := &view{m: m, after: seq, page: page, tail: m.tail(page.Last)}
	v.bound()
	return v, nil
}

// readAfter reads the page of m's stream after a known position.
func (h *Handler) readAfter(ctx context.Context, topic string, m *meta, after int64) (*view, error) {
	page, err := h.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: topic, After: after, Limit: pageEvents, MaxBytes: pageBytes})
	if err != nil {
		return nil, err
	}
	m2, ref, err := h.live(page)
	if err != nil {
		return nil, err
	}
	if ref != nil {
		return nil, ref
	}
	if m2.Base != m.Base {
		return nil, refuse(http.StatusNotFound, "stream not found") // deleted and created again meanwhile
	}
	v := &view{m: m2, after: after, page: page, tail: m2.tail(page.Last)}
	v.bound()
	return v, nil
}

// bound drops what a closed stream's page holds after its close.
func (v *view) bound() {
	if !v.m.Closed {
		return
	}
	evs := v.page.Events
	for len(evs) > 0 && evs[len(evs)-1].Sequence > v.m.ClosedAt {
		evs = evs[:len(evs)-1]
		v.page.More = false
	}
	v.page.Events = evs
}

// live decodes a page's stream: a refusal when it is missing or expired.
func (h *Handler) live(page storage.StreamPage) (*meta, *refusal, error) {
	if !page.Found {
		return nil, refuse(http.StatusNotFound, "stream not found"), nil
	}
	m, err := decodeMeta(page.Record)
	if err != nil {
		return nil, nil, err
	}
	if m.expired(h.Now()) {
		return nil, refuse(http.StatusNotFound, "stream not found"), nil
	}
	return m, nil, nil
}

// position checks that o is a position of m's stream (page was read
// after o): its base, or an event of its topic up to its tail. Anything
// else is gone: an offset of an earlier incarnation, of another stream,
// beyond the tail, foreign to the log (a restored or replaced log), or
// below what retention kept. Never data as if contiguous.
func position(m *meta, page storage.StreamPage, o int64) *refusal {
	gone := func(code, msg string) *refusal {
		return &refusal{status: http.StatusGone, code: code, msg: msg}
	}
	switch {
	case o == m.Base:
		return nil
	case o < m.Base:
		return gone("unknown_offset", "the offset is not of this stream (another stream's, or an earlier incarnation's): read again from -1")
	case page.Foreign || o > page.Head:
		return gone("unknown_offset", "the log never issued this offset (a restored or replaced log): read again from -1")
	case o > m.tail(page.Last):
		return gone("unknown_offset", "the offset is beyond the stream's tail")
	case page.At:
		return nil
	case o <= page.Watermark:
		return gone("retention", "retention deleted what follows this offset: read again from -1")
	}
	return gone("unknown_offset", "the offset is not of this stream: read again from -1")
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
	body := appendBody(nil, encodingOf(v.m.ContentType), v.page.Events)
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
		cur, ok, err := t.stream(ctx, topic)
		if err != nil || !ok || cur.Base != m.Base {
			return err
		}
		cur.Access = t.now.UnixMilli()
		return t.put(ctx, topic, cur)
	})
	if err != nil && ctx.Err() == nil {
		h.Logger.Warn("replayd: durable streams: slide a stream's TTL", "topic", topic, "err", err)
	}
}
