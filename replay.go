package replayd

import (
	"context"
	"errors"

	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/storage"
)

// What the log owes a stream resuming from its cursor (PROTOCOL.md,
// "Reconnecting"): its handshake, read in one snapshot of the index, the gap it
// is told of, and its replay, read and written a page at a time. open
// calls them in that order, after the stream subscribed to live delivery,
// so that a row committed meanwhile is either at or below the handshake's
// head or queued.

// handshake reads a stream's handshake from the log and works out its
// gap. It returns the cursor the stream's hello carries (its own, or the
// head if it is fresh or treated as fresh), the window to replay and the
// gap, nil if none; false if the stream ended (it was answered).
func (c *sseStream) handshake() (cursor int64, hs storage.Window, g *wireGap, ok bool) {
	h, w, ctx := c.h, c.w, c.ctx
	cursor, valid := parseCursor(c.rawCursor)
	readFrom := int64(-1) // fresh: read only the head
	if c.rawCursor != "" && valid {
		readFrom = cursor
	}
	// A revocation is checked before the log is read and again before the
	// hello is written: its watch cancels ctx from another goroutine, and
	// may not have yet.
	if isRevoked(ctx) {
		endEarly(w, "access revoked")
		return 0, hs, nil, false
	}
	hs, err := h.readHandshake(ctx, c.topics, readFrom)
	if isRevoked(ctx) {
		endEarly(w, "access revoked")
		return 0, hs, nil, false
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrClosed):
			endEarly(w, "server is shutting down")
		case ctx.Err() == nil:
			h.logger.Error("replayd: read the log for a new stream", "topics", c.topics, "remote", c.remote, "err", err)
			endEarly(w, "event log unavailable")
		}
		return 0, hs, nil, false
	}
	g = gapFor(c.rawCursor, cursor, valid, hs, h.opts.SSE.ReplayLimit)
	if g != nil {
		h.metrics.gap(g.Reason)
	}
	if readFrom < 0 || cursor > hs.Head || hs.Foreign {
		cursor = hs.Head // fresh, or treated as fresh
	}
	return cursor, hs, g, true
}

// readHandshake reads what a new stream needs from the log on a goroutine
// of its own: SQLite's code grows the stack that runs it, and a handler's
// stack stays that size for as long as the connection is open (measured:
// 38.5 against 30.6 KiB per idle connection).
func (h *EventHub) readHandshake(ctx context.Context, topics []string, cursor int64) (hs storage.Window, err error) {
	if !h.acquireRead(ctx) {
		if ctx.Err() != nil {
			return hs, ctx.Err()
		}
		return hs, ErrClosed
	}
	defer h.releaseRead()
	offStack(func() {
		if cursor < 0 { // a fresh client: only the head
			hs.Head, err = h.store.Head(ctx)
			return
		}
		hs, err = h.store.Window(ctx, topics, cursor, h.opts.SSE.ReplayLimit)
	})
	return hs, err
}

// offStack runs fn on a short-lived goroutine and waits for it, so that the
// stack SQLite grows is not the caller's (see readHandshake).
func offStack(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

// gapFor returns the gap frame a new stream is owed, or nil (PROTOCOL.md, "gap").
func gapFor(rawCursor string, cursor int64, valid bool, hs storage.Window, limit int) *wireGap {
	switch {
	case rawCursor == "":
		return nil
	case !valid:
		return &wireGap{Reason: reasonInvalidCursor, ReplayLimit: limit}
	case cursor > hs.Head || hs.Foreign:
		// Not a cursor of this log (see Store, the sequence floor).
		return &wireGap{Reason: reasonUnknownCursor, ResumedFrom: ptr(cursor), ReplayLimit: limit}
	case hs.Watermark > cursor:
		return &wireGap{
			Reason:        reasonPruned,
			ResumedFrom:   ptr(cursor),
			MissedFrom:    ptr(cursor + 1),
			MissedThrough: ptr(max(hs.Watermark, hs.Skipped.Last)),
			ReplayLimit:   limit,
		}
	case hs.Skipped.Count > 0:
		return &wireGap{
			Reason:        reasonReplayLimit,
			ResumedFrom:   ptr(cursor),
			MissedFrom:    ptr(hs.Skipped.First),
			MissedThrough: ptr(hs.Skipped.Last),
			Missed:        ptr(hs.Skipped.Count),
			ReplayLimit:   limit,
		}
	}
	return nil
}

// Replay pages: a replay is read and written a page at a time, so a
// connection in replay holds one page (or one event larger than that) on
// top of its live queue.
const (
	replayPageEvents = 64
	replayPageBytes  = 64 << 10
)

// replay writes the window W of hs, the scope's events in [hs.From,
// hs.Head], page by page, each read under a handshake slot and written
// under the usual write deadline. The window may begin inside the range
// of the stream's pruned gap: events of topics pruned less are retained
// there (see storage.Store, Retention and watermarks). If retention pruned
// anything of the scope above the last event written and above that range,
// the page just read may lack rows: the stream ends instead, and the
// client's reconnect gets a pruned gap.
// It returns how many events it wrote, and false if the stream must end.
func (c *sseStream) replay(hs storage.Window) (n int, ok bool) {
	h, ctx, w, s, topics := c.h, c.ctx, c.w, c.s, c.topics
	for after := hs.From - 1; after < hs.Head; {
		if isRevoked(ctx) || !h.acquireRead(ctx) {
			return n, false
		}
		var (
			p   storage.Page
			err error
		)
		offStack(func() {
			p, err = h.store.Read(ctx, storage.ReadRequest{Scope: topics, After: after, Through: hs.Head, Limit: replayPageEvents, MaxBytes: replayPageBytes})
		})
		h.releaseRead()
		page, mark := p.Events, p.Watermark
		switch {
		case isRevoked(ctx):
			return n, false // nothing read after a revocation is written
		case err != nil:
			if ctx.Err() == nil {
				h.logger.Error("replayd: read a replay page", "topics", topics, "after", after, "err", err)
			}
			return n, false
		case mark > max(after, hs.Watermark):
			// A deletion at or below hs.Watermark is named by the pruned
			// gap the stream began with (hs.Watermark above the cursor),
			// or at or below the cursor: only a higher mark is news.
			h.logger.Warn("replayd: rows pruned during a replay; ending the stream so it resumes with a gap",
				"topics", topics, "after", after, "watermark", mark)
			return n, false
		case len(page) == 0:
			return n, true
		}
		ok := s.Send(w, func(b []byte) []byte {
			for _, ev := range page {
				b = live.AppendEventFrame(b, ev)
			}
			return b
		})
		if !ok {
			return n, false
		}
		n += len(page)
		after = page[len(page)-1].Sequence
		if h.testHookReplayPage != nil {
			h.testHookReplayPage(after)
		}
	}
	return n, true
}
