package live

import (
	"context"
	"time"

	"github.com/replayd/replayd/storage"
)

// CatchUpPage is how many rows one log read brings while catching up: a
// tail delivery that read as many has more waiting.
const CatchUpPage = 1000

// Deliver is live delivery's one path: the writer calls it with the rows
// it committed, the tail with none and the head it read. It brings the live
// position up to after, reading from the log the rows another process
// committed below it, then dispatches rows, which must be every row with a
// sequence in (after, last row's sequence], ascending. It holds catchMu
// throughout, so deliveries never interleave, and takes mu only to
// dispatch and to move the position (see Hub).
//
// The two callers differ only in what they can do with a failed read. The
// writer's rows are committed: it reads until it reaches after, and turns
// rows it cannot read into a gap (GapUnreadable), so that its rows are
// delivered anyway. The tail (onePage) reads at most one page, returns
// the error to back off and retry, and is called again at once after a
// full page. It reports how many rows it read from the log, and, for the
// tail, the CreatedAt of the newest row it dispatched (zero if none).
func (h *Hub) Deliver(after int64, rows []storage.Event, onePage bool) (n int, newest time.Time, err error) {
	h.catchMu.Lock()
	defer h.catchMu.Unlock()
	pos := h.Position()
	if len(rows) == 0 && after == pos {
		return 0, time.Time{}, nil // an idle tail poll: nothing new
	}
	if after < pos {
		// Rows at or below the live position: the other caller delivered
		// them already (a publish moved the position past the head the
		// tail read, or the tail read the writer's rows), or the log was
		// reset under the hub. The head, never below the position
		// otherwise, tells.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		head, err := h.log.Head(ctx)
		cancel()
		if err != nil && onePage {
			return 0, time.Time{}, err
		}
		h.mu.Lock()
		switch {
		case err != nil:
			h.logger.Error("replayd: cannot read the head to tell a reset log from rows already delivered",
				"after", after, "livePosition", h.pos, "err", err)
		case head < h.pos:
			h.logger.Warn("replayd: the log's head is below the live position: the log was reset or replaced; reconnecting streams",
				"head", head, "livePosition", h.pos)
			h.logReset(min(after, head))
		}
		h.mu.Unlock()
	}
	if !h.hasSubscribers() {
		// Nobody to deliver to: skip reading other writers' rows. A
		// subscriber that arrives later reads the head after subscribing,
		// so rows up to here reach it by replay.
		h.mu.Lock()
		// The poll window still takes rows known to be every row above
		// where they start.
		from := max(h.pos, after)
		for len(rows) > 0 && rows[0].Sequence <= from {
			rows = rows[1:]
		}
		h.window.add(from, rows)
		h.pos = max(h.pos, after)
		if k := len(rows); k > 0 {
			h.pos = max(h.pos, rows[k-1].Sequence)
		}
		h.mu.Unlock()
		return 0, time.Time{}, nil
	}
	if onePage { // the tail measures its lag from what this call dispatches
		h.mu.Lock()
		h.newestAt = time.Time{}
		h.mu.Unlock()
	}
	for pos := h.Position(); pos < after; pos = h.Position() {
		read, err := h.catchUp(after, CatchUpPage)
		n += read
		switch {
		case onePage && err != nil:
			return n, time.Time{}, err
		case onePage:
		case err != nil:
			// The rows in between cannot be read, so they cannot be
			// delivered in order: make every stream resume from the log.
			h.mu.Lock()
			h.logger.Error("replayd: cannot read rows committed by another process; reconnecting streams",
				"from", h.pos+1, "through", after, "err", err)
			h.Resync()
			h.window.reset()
			h.notifyGap(Gap{Reason: GapUnreadable, After: h.pos, From: h.pos + 1, Through: after})
			h.pos = after
			h.mu.Unlock()
			continue
		default:
			continue
		}
		break
	}
	if len(rows) > 0 {
		h.mu.Lock()
		h.dispatch(rows)
		h.flushFrames()
		h.mu.Unlock()
		return n, time.Time{}, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return n, h.newestAt, nil
}

// catchUp reads at most limit rows above the live position, stopping at
// through, and dispatches them. It reports how many rows it read. The caller
// holds catchMu, not mu: the read is made without it, and the dispatch
// under it.
func (h *Hub) catchUp(through int64, limit int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from := h.Position()
	page, err := h.log.Read(ctx, storage.ReadRequest{After: from, Through: through, Limit: limit})
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if page.Foreign {
		// The live position is a sequence the log never issued: it was
		// replaced under the hub (restored in place from a backup, say)
		// and its head raised past the lost history (the sequence floor),
		// which the rows above belong to no more. As for a head below the
		// position: every stream ends and resumes with unknown_cursor.
		h.logger.Warn("replayd: the live position is a sequence the log never issued: the log was replaced; reconnecting streams",
			"head", page.Head, "livePosition", from)
		h.logReset(min(through, page.Head))
		return 0, nil
	}
	if mark := page.Watermark; mark > max(from, h.reported) {
		// Rows above the live position were pruned before they were
		// delivered. The hole ends at mark, or at through, beyond which
		// this call delivers nothing. Rows of topics pruned less may be
		// retained inside it (retention per topic): the page holds them,
		// and they are dispatched after the gap. A mark not above the last
		// hole reported is no news: those rows were named by its gap.
		hole := min(mark, through)
		h.logger.Warn("replayd: rows were pruned before live delivery; reconnecting streams",
			"from", from+1, "through", hole)
		h.Resync()
		h.window.reset()
		h.notifyGap(Gap{Reason: GapPruned, After: from, From: from + 1, Through: hole})
		h.reported = hole
	}
	h.dispatch(page.Events)
	h.flushFrames()
	if !page.More && h.pos < through {
		// Every row up to through is read, even when through itself has no
		// row (a sequence spent by a duplicate event id, or pruned): the
		// position may move there.
		h.window.extend(h.pos, through)
		h.pos = through
	}
	return len(page.Events), nil
}

// logReset handles a head below the live position, or a live position the
// log finds foreign: the log was reset or replaced from outside, and its
// sequences start again (or, raised by the sequence floor, go on above the
// lost history's). Like a cursor above the head (an unknown_cursor gap),
// every stream ends, so its client reconnects, is told by an
// unknown_cursor gap and goes on from the new head; gap subscribers are
// told the same; the live position moves to through, above which rows are
// delivered again. The caller holds catchMu and mu, and has logged why.
func (h *Hub) logReset(through int64) {
	h.Resync()
	h.window.reset()
	h.notifyGap(Gap{Reason: GapUnknownCursor, After: h.pos, From: 1, Through: through})
	h.pos, h.reported = through, 0
}

// Resync ends every open stream so that its client reconnects and resumes
// from the log, where the guarantee is kept by replay and gaps.
func (h *Hub) Resync() {
	h.streamsMu.Lock()
	defer h.streamsMu.Unlock()
	for s := range h.open {
		s.Kill()
	}
}
