package replayd

import (
	"context"
	"sync"
	"time"
)

// TailOptions tunes StartTail.
type TailOptions struct {
	// MaxInterval is the ceiling of the poll interval while the log is
	// idle: each empty poll doubles the interval up to it, and the first
	// rows bring it back down. 0: poll at a fixed cadence.
	MaxInterval time.Duration
}

// defaultTailInterval is StartTail's interval when it is given none.
const defaultTailInterval = 200 * time.Millisecond

// StartTail polls the log for rows committed by any process, other
// processes included, and delivers them live through the same path as this
// hub's own publishes: every row exactly once, in sequence order. Use it in
// a process that serves SSE while others publish. interval <= 0 means
// 200ms. An idle poll reads only the head, one indexed row; a database
// error is logged and retried with back-off. A head below the live
// position (the log was reset or replaced) ends every stream and moves the
// live position to the new head; see SubscribeWithGaps and GapUnknownCursor.
//
// A second StartTail returns ErrAlreadyTailing until stop is called; stop
// waits for the poller to exit and is safe to call more than once.
func (h *EventHub) StartTail(interval time.Duration, opts TailOptions) (stop func(), err error) {
	if interval <= 0 {
		interval = defaultTailInterval
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return nil, ErrClosed
	case h.tailing:
		return nil, ErrAlreadyTailing
	}
	h.tailing = true
	ctx, cancel := context.WithCancel(h.ctx)
	exited := make(chan struct{})
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(exited)
		h.tail(ctx, interval, opts.MaxInterval)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-exited
			h.metrics.tailLag(0)
			h.mu.Lock()
			h.tailing = false
			h.mu.Unlock()
		})
	}, nil
}

func (h *EventHub) tail(ctx context.Context, interval, maxInterval time.Duration) {
	idleCeiling := max(interval, maxInterval)
	errCeiling := max(idleCeiling, 5*time.Second)
	delay, errDelay := time.Duration(0), interval
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		n, err := h.poll(ctx)
		h.metrics.tailPolled()
		h.checkLogFile(true) // logs a deleted or replaced file; Publish refuses
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			h.logger.Warn("replayd: tail poll failed; retrying", "in", errDelay, "err", err)
			delay, errDelay = errDelay, min(2*errDelay, errCeiling)
		case n >= catchUpPage:
			delay, errDelay = 0, interval // a full page: more is waiting
		case n > 0 || maxInterval <= 0:
			delay, errDelay = interval, interval
		default:
			delay = min(max(2*delay, interval), idleCeiling)
		}
		timer.Reset(delay)
	}
}

// poll delivers rows above the live position, a page at most, and reports
// how many it read. When nothing new is committed it reads only the head.
func (h *EventHub) poll(ctx context.Context) (int, error) {
	head, err := h.store.latestSequence(ctx)
	if err != nil {
		return 0, err
	}
	h.live.mu.Lock()
	defer h.live.mu.Unlock()
	if head < h.live.pos {
		// Either a publish moved the position past the head read before
		// the lock, or the log was reset: a head read now tells.
		if head, err = h.store.latestSequence(ctx); err != nil {
			return 0, err
		}
		if head < h.live.pos {
			h.logReset(head, head)
			return 0, nil
		}
	}
	switch {
	case head <= h.live.pos:
		h.metrics.tailLag(0)
		return 0, nil
	case !h.live.hasSubscribers():
		h.live.pos = head // see deliver
		h.metrics.tailLag(0)
		return 0, nil
	}
	h.live.newestAt = time.Time{}
	n, err := h.catchUp(head, catchUpPage)
	if !h.live.newestAt.IsZero() {
		h.metrics.tailLag(time.Since(h.live.newestAt))
	}
	return n, err
}
