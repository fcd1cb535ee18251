package replayd

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Request admission (PROTOCOL.md, "Status codes"). Every SSE request, and every poll request,
// passes the same checks in the same order, each cheaper than the next,
// before it costs anything: the method (checked by each handler, whose
// Allow header differs), the origin, the topics, the connection cap, then
// Options.Authorize. A refusal is answered at once and counted under its
// reason; nothing is read from the log and nothing is subscribed.

// admitStream is an SSE request's admission step: the method check, then
// admit's. It returns the stream admitted, holding its connection slot, or
// nil if the request was answered: refused, a preflight (OPTIONS), or a
// HEAD, which gets a stream's headers and nothing more. It is kept out of
// line, so that its frame is not in an idle stream's stack (see
// sseHandler.ServeHTTP).
//
//go:noinline
func (h *EventHub) admitStream(w http.ResponseWriter, r *http.Request) *sseStream {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodOptions:
		h.preflight(w, r, "GET, HEAD, OPTIONS")
		return nil
	default:
		w.Header().Set("Allow", "GET, HEAD, OPTIONS")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return nil
	}
	query, topics, release, ok := h.admit(w, r, transportSSE)
	if !ok {
		return nil
	}
	rawCursor := r.Header.Get("Last-Event-ID")
	if rawCursor == "" {
		rawCursor = query.Get("lastEventId")
	}
	setStreamHeaders(w)
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		release()
		return nil
	}
	c := &sseStream{h: h, w: w, ctx: r.Context(), topics: topics, rawCursor: rawCursor, remote: r.RemoteAddr, release: release}
	if len(topics) == 1 {
		c.topic = topics[0]
	}
	return c
}

// admit runs the checks that follow the method check for a request of the
// given transport. On success it returns the parsed query, the scope's
// topics and a release that the handler must call once when it is done.
// For an SSE request the request then holds a connection slot until
// release; a poll request is only refused while the cap is reached, and
// holds a slot (acquireSlot) only while it waits. On failure the answer has
// been written.
func (h *EventHub) admit(w http.ResponseWriter, r *http.Request, transport string) (query url.Values, topics []string, release func(), ok bool) {
	if !h.allowOrigin(w, r) {
		h.metrics.refused(refusedOrigin)
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return nil, nil, nil, false
	}
	// Not r.URL.Query(): it drops a malformed pair silently, and a dropped
	// topic would widen the scope ("?topic=a;b" would be global).
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		h.metrics.refused(refusedBadRequest)
		http.Error(w, "malformed query", http.StatusBadRequest)
		return nil, nil, nil, false
	}
	o := &h.opts.SSE
	topics, err = parseTopics(query, o.TopicParam, o.MaxTopics)
	if err != nil {
		h.metrics.refused(refusedBadRequest)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, nil, nil, false
	}
	release = func() {}
	if transport == transportPoll {
		if h.atCapacity() {
			h.overloaded(w, r, transport)
			return nil, nil, nil, false
		}
	} else if release, ok = h.acquireSlot(); !ok {
		h.overloaded(w, r, transport)
		return nil, nil, nil, false
	}
	if err := h.authorize(r, topics); err != nil {
		release()
		status, body, reason := http.StatusForbidden, "forbidden", refusedForbidden
		if errors.Is(err, ErrUnauthenticated) {
			status, body, reason = http.StatusUnauthorized, "unauthorized", refusedUnauthenticated
		}
		h.metrics.refused(reason)
		h.logger.Debug("replayd: request refused by Authorize", "status", status, "topics", topics, "err", err)
		http.Error(w, body, status)
		return nil, nil, nil, false
	}
	return query, topics, release, true
}

// allowOrigin applies the origin policy of SSEOptions.AllowedOrigins, setting the CORS response
// headers of an allowed cross-origin request.
func (h *EventHub) allowOrigin(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	allowed := h.opts.SSE.AllowedOrigins
	switch {
	case len(allowed) == 0:
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		return origin == "" || strings.EqualFold(origin, scheme+"://"+r.Host)
	case slices.Contains(allowed, "*"):
		w.Header().Set("Access-Control-Allow-Origin", "*")
		return true
	}
	w.Header().Add("Vary", "Origin")
	if origin == "" {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(a, origin) {
			w.Header().Set("Access-Control-Allow-Origin", origin)
			return true
		}
	}
	return false
}

// preflight answers OPTIONS: a CORS preflight from an allowed origin gets
// 204 allowing GET with Last-Event-ID and Cache-Control; any other origin
// 403. An OPTIONS without Origin is not a preflight and just lists methods.
func (h *EventHub) preflight(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	if r.Header.Get("Origin") != "" {
		if !h.allowOrigin(w, r) {
			http.Error(w, "origin not allowed", http.StatusForbidden)
			return
		}
		w.Header().Set("Access-Control-Allow-Methods", "GET")
		w.Header().Set("Access-Control-Allow-Headers", "Last-Event-ID, Cache-Control")
		w.Header().Set("Access-Control-Max-Age", "600")
	}
	w.WriteHeader(http.StatusNoContent)
}

// authorize asks Options.Authorize, if set, about the scope. It gets a copy
// of topics, so the hook cannot change the scope it grants.
func (h *EventHub) authorize(r *http.Request, topics []string) error {
	if h.opts.Authorize == nil {
		return nil
	}
	return h.opts.Authorize(r, slices.Clone(topics))
}

// acquireSlot takes one of the SSEOptions.MaxConnections slots for an open
// SSE stream or a waiting long poll; false when every slot is taken. The
// caller must call release exactly once when the stream ends or the wait
// is over. Without a cap it always succeeds (the count is still kept).
func (h *EventHub) acquireSlot() (release func(), ok bool) {
	limit := int64(h.opts.SSE.MaxConnections)
	for {
		n := h.conns.Load()
		if limit > 0 && n >= limit {
			return nil, false
		}
		if h.conns.CompareAndSwap(n, n+1) {
			return h.releaseSlot, true
		}
	}
}

func (h *EventHub) releaseSlot() { h.conns.Add(-1) }

// atCapacity reports whether every connection slot is taken.
func (h *EventHub) atCapacity() bool {
	limit := int64(h.opts.SSE.MaxConnections)
	return limit > 0 && h.conns.Load() >= limit
}

// overloadDelay draws the reconnect delay told to a refused client, in
// [1x, 2x] SSEOptions.OverloadRetry, so refused clients do not all come
// back at once.
func (h *EventHub) overloadDelay() (ms int64) {
	base := max(h.opts.SSE.OverloadRetry.Milliseconds(), 1)
	return base + rand.Int64N(base+1)
}

// overloaded answers a request refused by the connection cap. An SSE
// request gets 200 text/event-stream holding only a retry field and a
// comment: an EventSource reconnects by itself after that delay with its
// Last-Event-ID, while any other status would make it give up for good. A
// poll request gets 503 with Retry-After in whole seconds.
func (h *EventHub) overloaded(w http.ResponseWriter, r *http.Request, transport string) {
	h.metrics.refused(refusedOverload)
	ms := h.overloadDelay()
	if transport == transportPoll {
		w.Header().Set("Retry-After", strconv.FormatInt((ms+999)/1000, 10))
		http.Error(w, "server busy, retry later", http.StatusServiceUnavailable)
		return
	}
	setStreamHeaders(w)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	b := appendRetry(make([]byte, 0, 64), ms)
	w.Write(append(b, ": server busy, retry later\n\n"...))
}
