package replayd

import (
	"context"

	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/storage"
)

// Live delivery is internal/live's: the hub holds a *live.Hub (h.live),
// which the writer and the tail deliver through (live.Hub.Deliver), SSE
// streams and long polls subscribe to, and polls near the head are
// answered from (live.Hub.AnswerPoll). This file is the hub's side of it.

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

// newLive returns the hub's live delivery, at the log's head.
func (h *EventHub) newLive(head int64) *live.Hub {
	return live.New(live.Config{
		Position:     head,
		Log:          (*logReader)(h),
		ProbeLog:     (*slotReader)(h),
		Sink:         &h.metrics,
		Logger:       h.logger,
		WindowEvents: h.opts.Poll.MemoryEvents,
		WindowBytes:  h.opts.Poll.MemoryBytes,
		EncodesAsIs:  encodesAsIs,
	})
}

// subscribe registers fn and gap with live delivery (see SubscribeWithGaps).
func (h *EventHub) subscribe(fn func(Event), gap func(Gap)) func() {
	if gap == nil {
		return h.live.Subscribe(fn, nil)
	}
	return h.live.Subscribe(fn, func(g live.Gap) { gap(Gap(g)) })
}

// logReader reads the log as the hub does, through h.store (which tests
// may swap for a faulty one after New).
type logReader EventHub

func (r *logReader) Head(ctx context.Context) (int64, error) { return r.store.Head(ctx) }

func (r *logReader) Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error) {
	return r.store.Read(ctx, req)
}

// slotReader reads the log under a read slot (acquireRead): the poll
// window's head probes, which polls share.
type slotReader EventHub

func (r *slotReader) Head(ctx context.Context) (int64, error) {
	h := (*EventHub)(r)
	if err := h.takeRead(ctx); err != nil {
		return 0, err
	}
	defer h.releaseRead()
	return h.store.Head(ctx)
}

func (r *slotReader) Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error) {
	h := (*EventHub)(r)
	if err := h.takeRead(ctx); err != nil {
		return storage.Page{}, err
	}
	defer h.releaseRead()
	return h.store.Read(ctx, req)
}

// takeRead is acquireRead, with why it failed: ctx's error, or ErrClosed.
func (h *EventHub) takeRead(ctx context.Context) error {
	if h.acquireRead(ctx) {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return ErrClosed
}
