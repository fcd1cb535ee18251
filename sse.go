package replayd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/internal/live"
)

// sseHandler is the hub's SSE endpoint.
type sseHandler EventHub

// ServeHTTP is an SSE stream's one entry. Its steps, in order, each a
// function of one job:
//
//  1. admit (admitStream, admit.go): the method, the origin, the query and
//     its topics, a connection slot, Authorize. A refusal is answered
//     there, and so are a preflight and a HEAD.
//  2. detach (detach.go), with SSEOptions.DetachConnections: the
//     connection is taken off net/http, and serveDetached runs the steps
//     below on a goroutine of its own once this handler returned.
//  3. open: refuse a stream that cannot be served, watch for its
//     revocation (watchRevocation, revoke.go), subscribe it, read its
//     handshake and write its hello, its gap and its replay (replay.go).
//  4. live (liveLoop): live events and heartbeats, until the client, the
//     hub, a write or a revocation ends the stream.
//  5. end: what the steps before did is undone, last first.
//
// A stream served on this goroutine sits in liveLoop called from here, so
// its idle stack holds only net/http's frames, this one and liveLoop's;
// the steps before it are kept out of line (see open).
func (sh *sseHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := (*EventHub)(sh).admitStream(w, r)
	if c == nil {
		return
	}
	if c.detach(r) {
		return // serveDetached has it
	}
	defer c.end(nil) // a panic goes on up to net/http, which logs it
	if c.open() {
		c.liveLoop()
	}
}

// sseStream is one SSE stream from its admission to its end: what its
// steps need, and what its end must undo. It is used by the stream's
// goroutine alone (its handler's, or serveDetached).
type sseStream struct {
	h         *EventHub
	w         http.ResponseWriter
	ctx       context.Context // ends with the stream: the request's, or one of its own (detach, watchRevocation)
	topics    []string
	topic     string // the single topic, for HeartbeatData; "" if none
	rawCursor string // Last-Event-ID, or the lastEventId parameter; "" if none
	remote    string // the client's address, for logs

	// What end undoes, each set by the step that did it.
	release  func()       // frees the admission's MaxConnections slot (admitStream)
	cw       *connWriter  // the connection taken off net/http (detach); nil on a handler
	cancel   func()       // ends ctx (detach, watchRevocation); nil while ctx is the request's
	unrevoke func()       // ends the revocation watch (watchRevocation); nil if none
	s        *live.Stream // the live queue, once subscribed (subscribe); nil before
	unread   func()       // ends the read of the jobs among topics (subscribe); nil if none

	// The live phase.
	floor   int64       // the last sequence written; the queue may repeat some at or below it
	hb      *time.Timer // the heartbeat timer; nil without heartbeats
	beatDue atomic.Bool // hb fired
	stopCtx func() bool // stops the wake-up at the context's end
}

// open is a stream's open step: it refuses a stream that cannot be served,
// watches for its revocation, subscribes it, reads its handshake and
// writes its hello, its gap and its replay. It reports whether the stream
// goes live; if not, the stream was answered, and end undoes the rest.
// Everything it needs on the stack is gone once it returns: the runtime
// sizes a goroutine's stack by the deepest call it made and halves it, at
// a collection, only down to what the goroutine uses, so a stream that
// parks below open's frame would hold a stack twice as large (measured
// through net/http: 16 KiB against 8 KiB a stream).
//
//go:noinline
func (c *sseStream) open() bool {
	h, w := c.h, c.w
	if !canFlush(w) {
		// Without flushing nothing reaches the client until the handler
		// returns: a stream that can never work. Refused before anything
		// is subscribed or read.
		if h.noFlushLogged.CompareAndSwap(false, true) {
			h.logger.Error("replayd: the http.ResponseWriter cannot flush: every SSE stream is refused with 500. "+
				"A middleware's ResponseWriter must implement http.Flusher, or Unwrap() to one (see http.ResponseController)",
				"type", fmt.Sprintf("%T", w))
		}
		http.Error(w, "server misconfigured: the ResponseWriter has no Flush (nor Unwrap), so events cannot be streamed",
			http.StatusInternalServerError)
		return false
	}
	if isRevoked(c.ctx) {
		// Revoked before it was served: refused, as by Authorize, but in
		// a way that makes an EventSource come back (see WithRevocation).
		h.metrics.refused(refusedForbidden)
		endEarly(w, "access revoked")
		return false
	}
	c.watchRevocation()
	if !c.subscribe() {
		return false
	}
	cursor, hs, g, ok := c.handshake()
	if !ok || !c.writeHello(cursor, hs.Head, g) {
		return false
	}
	replayed, ok := 0, true
	if cursor < hs.Head {
		replayed, ok = c.replay(hs)
	}
	h.metrics.replayed(transportSSE, replayed)
	if !ok || isRevoked(c.ctx) {
		return false
	}
	if h.testHookBeforeLive != nil {
		h.testHookBeforeLive()
	}
	// Live. Everything at or below the head was replayed, named in the
	// gap, or is invisible to this scope; the queue may repeat some of it.
	c.floor = hs.Head
	return true
}

// subscribe registers the stream with the hub, so that Close and a resync
// can end it, and with live delivery; false if the hub is closed (the
// stream was answered).
func (c *sseStream) subscribe() bool {
	h := c.h
	s := live.NewStream(c.topics, http.NewResponseController(c.w), h.opts.SSE.MaxBufferedBytes)
	if !h.addStream(s) {
		endEarly(c.w, "server is shutting down")
		return false
	}
	c.s = s // undone by finish
	h.clients.opened(c.topics)
	c.unread = h.reading(c.topics)
	h.metrics.connOpened(transportSSE)

	// Subscribe before reading the head: every row committed later is
	// queued on s, every row committed earlier is at or below the head.
	h.live.AddStream(s)
	if h.testHookAfterSubscribe != nil {
		h.testHookAfterSubscribe()
	}
	return true
}

// writeHello writes the stream's hello, after the retry delay if one is
// set, and before the gap g if there is one; false if the stream must end.
func (c *sseStream) writeHello(cursor, head int64, g *wireGap) bool {
	o := &c.h.opts.SSE
	hi := hello{Topics: c.topics, Cursor: cursor, Head: head}
	if hi.Topics == nil {
		hi.Topics = []string{}
	}
	if c.topic != "" {
		hi.Topic = &c.topic
	}
	return c.s.Send(c.w, func(b []byte) []byte {
		if o.Retry > 0 {
			b = appendRetry(b, o.Retry.Milliseconds())
		}
		b = live.AppendEventFrame(b, Event{Sequence: cursor, Type: "hello", Payload: mustJSON(hi)})
		if g != nil {
			b = live.AppendFrame(b, o.GapEventType, mustJSON(g))
		}
		return b
	})
}

// liveLoop is a stream's live step: it streams live events and heartbeats
// until the client, the hub or a write gives up, on the goroutine that
// opened the stream. Its one wait is a receive on the stream's wake
// channel, which the queue, the heartbeat timer and the context's end all
// signal: a channel receive's frames are smaller than a select's, which
// keeps an idle stream's stack shallow (see open), as does keeping
// liveLoop out of line.
//
//go:noinline
func (c *sseStream) liveLoop() {
	signal := c.signal
	c.arm(signal, func() {
		c.beatDue.Store(true)
		signal()
	})
	defer c.disarm()
	for {
		<-c.s.Wake()
		if !c.step() {
			return
		}
	}
}

// signal wakes liveLoop.
func (c *sseStream) signal() { c.s.Signal() }

// arm starts what wakes a live stream besides its queue: its heartbeat
// timer, which calls beat, and its context's end, which calls wake.
func (c *sseStream) arm(wake, beat func()) {
	if iv := c.h.opts.SSE.HeartbeatInterval; iv > 0 {
		c.hb = time.AfterFunc(iv, beat)
	}
	if sc, ok := c.ctx.(*streamCtx); ok {
		c.stopCtx = sc.AfterFunc(wake) // no context of its own to keep
	} else {
		c.stopCtx = context.AfterFunc(c.ctx, wake)
	}
}

// disarm stops what arm started.
func (c *sseStream) disarm() {
	if c.hb != nil {
		c.hb.Stop()
	}
	if c.stopCtx != nil {
		c.stopCtx()
	}
}

// step does what a wake-up asks, for every reason there may be at once:
// the stream's end (its context, the hub's), the frames queued, the
// heartbeat due; false if the stream must end.
func (c *sseStream) step() bool {
	if c.ctx.Err() != nil {
		return false
	}
	select {
	case <-c.h.done:
		return false
	default:
	}
	if !c.writeQueued() {
		return false
	}
	if c.beatDue.Swap(false) {
		if !c.beat(time.Now()) {
			return false
		}
		c.hb.Reset(c.h.opts.SSE.HeartbeatInterval)
	}
	return true
}

// writeQueued writes to the client what the queue holds above the floor;
// false if the stream must end.
func (c *sseStream) writeQueued() bool {
	s := c.s
	q, ok := s.Take()
	if !ok || isRevoked(c.ctx) {
		s.Release(q)
		return false
	}
	if len(q) == 0 {
		return true
	}
	ok = s.Send(c.w, func(b []byte) []byte {
		for _, f := range q {
			if f.Sequence > c.floor {
				b = append(b, f.Bytes...)
				c.floor = f.Sequence
			}
		}
		return b
	})
	s.Release(q)
	return ok
}

// beat writes a heartbeat; false if the stream must end.
func (c *sseStream) beat(now time.Time) bool {
	if isRevoked(c.ctx) {
		return false
	}
	o := &c.h.opts.SSE
	var extra any
	if o.HeartbeatData != nil {
		extra = o.HeartbeatData(c.topic)
	}
	data, err := heartbeatData(now.UnixMilli(), extra)
	if err != nil {
		c.h.logger.Warn("replayd: encode HeartbeatData", "topic", c.topic, "err", err)
	}
	return c.s.Send(c.w, func(b []byte) []byte { return live.AppendFrame(b, "heartbeat", data) })
}

// end is a stream's last step, however it ended (answered by open, its
// live phase over, a panic): it undoes what the steps before did, last
// first. p is a detached stream's panic, if any (closeDetached logs it);
// a panic on a handler goes on up to net/http.
func (c *sseStream) end(p any) {
	c.finish()
	if c.cw != nil {
		c.closeDetached(p)
	}
	if c.unrevoke != nil {
		c.unrevoke()
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.release()
	if c.cw != nil {
		c.h.wg.Done() // detach's
	}
}

// finish undoes what subscribe did, if it did: the stream leaves the live
// set, the counts and the hub.
func (c *sseStream) finish() {
	h, s := c.h, c.s
	if s == nil {
		return
	}
	h.live.RemoveStream(s)
	h.metrics.connClosed(transportSSE)
	h.clients.closed(c.topics)
	if c.unread != nil {
		c.unread()
	}
	if s.WasCut() {
		h.logger.Info("replayd: slow consumer disconnected: its unsent frames passed MaxBufferedBytes",
			"topics", c.topics, "remote", c.remote, "maxBufferedBytes", h.opts.SSE.MaxBufferedBytes)
	}
	h.removeStream(s)
}

// setStreamHeaders sets the headers of an SSE response (PROTOCOL.md, "Response").
func setStreamHeaders(w http.ResponseWriter) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream; charset=utf-8")
	hdr.Set("Cache-Control", "no-cache, no-transform")
	hdr.Set("X-Accel-Buffering", "no")
}

// canFlush reports whether w can flush, found out as http.ResponseController
// does but without flushing: w, or a writer its Unwrap chain leads to,
// implements http.Flusher or FlushError.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case http.Flusher, interface{ FlushError() error }:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// endEarly ends a stream before its hello: a 200 with only a comment, so an
// EventSource reconnects after its retry delay with the same Last-Event-ID.
// Any other status, 503 included, would make it give up for good.
func endEarly(w http.ResponseWriter, reason string) {
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(": " + reason + "\n\n"))
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called on types that always encode
	}
	return b
}

// addStream registers s so Close and a resync can end it; false if the hub
// is closed.
func (h *EventHub) addStream(s *live.Stream) bool {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return false
	}
	h.wg.Add(1)
	h.mu.Unlock()
	if !h.live.Track(s) { // closed since
		h.wg.Done()
		return false
	}
	return true
}

func (h *EventHub) removeStream(s *live.Stream) {
	h.live.Untrack(s)
	h.wg.Done()
}

// bufPool holds write buffers, so an idle connection keeps none.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// handshakeSlots is how many SSE log reads may run at once on a pool of
// poolSize connections (0: unlimited): two fewer than the pool, one
// reserved by the writer and one left for the live catch-up and the tail,
// and at least one. A pool of one (":memory:") serialises everything
// anyway; one slot keeps at most one handshake ahead of a publish there.
func handshakeSlots(poolSize int) int {
	if poolSize <= 0 {
		return 8
	}
	return max(poolSize-2, 1)
}

// acquireRead takes a handshake slot; false if ctx ends or the hub closes
// first, or has closed (a free slot does not win against Close: select
// would pick either). Release it with releaseRead.
func (h *EventHub) acquireRead(ctx context.Context) bool {
	select {
	case <-h.done:
		return false
	default:
	}
	select {
	case h.handshakes <- struct{}{}:
		return true
	case <-ctx.Done():
	case <-h.done:
	}
	return false
}

func (h *EventHub) releaseRead() { <-h.handshakes }
