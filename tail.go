package replayd

import (
	"context"
	"sync"
	"time"

	"github.com/replayd/replayd/storage"

	"github.com/replayd/replayd/internal/live"
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
// 200ms. If the hub's Store is a [Notifier] (PostgreSQL's LISTEN/NOTIFY,
// say), the tail is woken at once by an append and the interval is only the
// fallback poll, so a lost notification delays rows by at most the
// interval and never loses one. An idle poll reads only the head, one indexed row; a database
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
	notifier, _ := h.store.(storage.Notifier)
	failing := false
	for {
		if notifier != nil && delay > 0 && !failing {
			// Woken at once by an append, from any process; the
			// interval is only the fallback poll.
			h.waitForAppend(ctx, notifier, delay)
			timer.Stop() // no stale tick can follow (Go 1.23 timers)
		} else {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		n, err := h.tailOnce(ctx)
		failing = err != nil
		h.metrics.tailPolled()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			h.logger.Warn("replayd: tail poll failed; retrying", "in", errDelay, "err", err)
			delay, errDelay = errDelay, min(2*errDelay, errCeiling)
		case n >= live.CatchUpPage:
			delay, errDelay = 0, interval // a full page: more is waiting
		case n > 0 || maxInterval <= 0:
			delay, errDelay = interval, interval
		default:
			delay = min(max(2*delay, interval), idleCeiling)
		}
		timer.Reset(delay)
	}
}

// waitForAppend waits at most d for n to report an append above the live
// position. An error of n's other than d passing (a store closed, a lost
// listener) is waited out until d has passed, so it never makes the tail
// spin.
func (h *EventHub) waitForAppend(ctx context.Context, n storage.Notifier, d time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := n.WaitForAppend(wctx, h.live.Position()); err != nil && wctx.Err() == nil {
		<-wctx.Done()
	}
}

// tailOnce delivers rows above the live position, a page at most, through
// live delivery's one path (live.Hub.Deliver), and reports how many it
// read. When nothing new is committed it reads only the head.
func (h *EventHub) tailOnce(ctx context.Context) (int, error) {
	head, err := h.store.Head(ctx)
	if err != nil {
		return 0, err
	}
	n, newest, err := h.live.Deliver(head, nil, true)
	switch {
	case err != nil:
	case !newest.IsZero():
		h.metrics.tailLag(time.Since(newest))
	case n == 0:
		h.metrics.tailLag(0)
	}
	return n, err
}
