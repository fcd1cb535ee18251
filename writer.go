package replayd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replayd/replayd/internal/event"
)

// The writer: Publish and PublishBatch hand their events to one writer
// goroutine through a queue (pubqueue.go), which commits what is waiting
// in one transaction (group commit), delivers it live and answers each
// caller; a lone Publish over a store whose Append returns with its ctx
// (storage.PromptAppender: the SQLite store) commits on its own goroutine
// instead (commitAlone). docs/design.md, Publishing, says why.

// publishReq is one event handed to the writer, and where its answer goes.
type publishReq struct {
	ev  Event
	res chan publishRes // buffered: the writer never waits on the caller
	// group, when set, holds this request and the others of one
	// PublishBatch, handed to the writer as one unit and committed
	// together (a batch may then exceed maxBatch by less than a group).
	group []*publishReq
	// withdrawn: the caller took the unit back from the queue before the
	// writer took it (guarded by the queue's mu).
	withdrawn bool
}

// addTo appends r, or the requests of r's group, to batch.
func (r *publishReq) addTo(batch []*publishReq) []*publishReq {
	if r.group != nil {
		return append(batch, r.group...)
	}
	return append(batch, r)
}

type publishRes struct {
	ev  Event
	dup bool // ev is the original stored under its event id
	err error
}

// commitAlone commits req on the caller's goroutine: no other publish is in
// progress and the writer is idle, so there is nothing to batch with. Handing
// the event to the writer goroutine and the answer back cost two wake-ups,
// about a fifth of a lone publish. The caller holds commitMu; commitAlone
// releases it.
//
// The commit ends early, storing nothing, when ctx ends or Close cancels
// commits; as with the writer, an ended ctx is reported as ErrOutcomeUnknown.
func (h *EventHub) commitAlone(ctx context.Context, req *publishReq, start time.Time) publishRes {
	defer h.commitMu.Unlock()
	select {
	case <-h.done:
		return publishRes{err: ErrClosed}
	default:
	}
	// While it commits, this publish is not one the writer should wait for
	// to fill a batch (see writeLoop).
	h.publishing.Add(-1)
	defer h.publishing.Add(1)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(h.writeCtx, cancel)()
	if h.testHookCommit != nil {
		h.testHookCommit()
	}
	h.commit(cctx, []*publishReq{req})
	r := <-req.res
	switch {
	case r.err == nil:
		h.metrics.publishDuration(time.Since(start))
	case ctx.Err() != nil && !errors.Is(r.err, ErrOutcomeUnknown) && !errors.Is(r.err, ErrClosed):
		r.err = fmt.Errorf("replayd: publish: %w: %w", ErrOutcomeUnknown, ctx.Err())
	}
	return r
}

// publishReq validates one publish and makes its request for the writer.
func (h *EventHub) publishReq(topic string, payload any, po event.Options) (*publishReq, error) {
	ev, err := event.Prepare(topic, payload, po)
	if err != nil {
		return nil, err
	}
	return &publishReq{ev: ev, res: make(chan publishRes, 1)}, nil
}

// enqueue hands unit (a request, or a group's first) to the writer
// goroutine. An error means nothing was stored.
func (h *EventHub) enqueue(ctx context.Context, unit *publishReq) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("replayd: publish: %w", err)
	}
	select {
	case <-h.done:
		return ErrClosed
	default:
	}
	if !h.queue.push(unit) {
		return ErrClosed
	}
	return nil
}

// await waits for the writer's answer to req, enqueued in unit. A caller
// that stops waiting takes its unit back if the writer has not taken it
// yet: then nothing was stored. Otherwise the writer has the event, and an
// answer that is not its own cannot say whether the event was stored.
func (h *EventHub) await(ctx context.Context, unit, req *publishReq, start time.Time) publishRes {
	select {
	case r := <-req.res:
		if r.err == nil {
			h.metrics.publishDuration(time.Since(start))
		}
		return r
	case <-ctx.Done():
		if h.queue.withdraw(unit) {
			return publishRes{err: fmt.Errorf("replayd: publish: %w", ctx.Err())}
		}
		return publishRes{err: fmt.Errorf("replayd: publish: %w: %w", ErrOutcomeUnknown, ctx.Err())}
	case <-h.abandoned:
		select {
		case r := <-req.res: // answered after all
			return r
		default:
		}
		if h.queue.withdraw(unit) {
			return publishRes{err: ErrClosed}
		}
		return publishRes{err: fmt.Errorf("replayd: publish: %w: the hub was closed while the event was being committed", ErrOutcomeUnknown)}
	}
}

// maxBatch bounds how many publishes one transaction commits.
const maxBatch = 1024

// writeLoop is the writer goroutine: it takes every Publish waiting at the
// moment, commits them in one transaction, delivers them live in sequence
// order and answers each caller. Once the hub is closed it takes no more,
// and refuses what is still queued.
func (h *EventHub) writeLoop() {
	defer h.wg.Done()
	defer func() {
		for _, unit := range h.queue.close() {
			for _, r := range unit.addTo(nil) {
				r.res <- publishRes{err: ErrClosed}
			}
		}
	}()
	batch := make([]*publishReq, 0, maxBatch)
	linger := time.NewTimer(lingerMax)
	linger.Stop()
	for {
		select {
		case <-h.done:
			return
		default:
		}
		if !h.queue.ask(1) {
			select {
			case <-h.queue.wake:
			case <-h.done:
				return
			}
			continue // the wake may be stale
		}
		h.gather(linger)
		batch = h.queue.take(batch[:0], maxBatch)
		h.commitMu.Lock()
		if h.testHookCommit != nil {
			h.testHookCommit()
		}
		h.commit(h.writeCtx, batch)
		h.commitMu.Unlock()
		clear(batch) // let the requests go
	}
}

// gather waits a moment for every publish in progress to reach the queue,
// so a busy log commits in big batches while a lone publisher never waits.
// (The previous batch's size, the estimate before, settled 64 publishers
// into two batches of ~32 taking turns.) When they come back one by one
// (on a busy machine each waits its turn for a CPU), it goes on waiting
// while each lingerGap brings more, lingerMax in all.
func (h *EventHub) gather(linger *time.Timer) {
	target := func() int { return min(max(int(h.publishing.Load()), 1), maxBatch) }
	if h.queue.ask(target()) {
		return
	}
	start, seen := time.Now(), h.queue.len()
	linger.Reset(lingerGap)
	defer linger.Stop() // no stale tick can follow (Go 1.23 timers)
	for {
		select {
		case <-h.queue.wake:
		case <-linger.C:
			n, left := h.queue.len(), lingerMax-time.Since(start)
			if n == seen || left <= 0 {
				return
			}
			seen = n
			linger.Reset(min(lingerGap, left))
		}
		if h.queue.ask(target()) {
			return
		}
	}
}

// The writer waits to fill a batch as long as each lingerGap brings
// another publish, and lingerMax in all. The bound before, 200 µs in all, let 64
// publishers on two busy cores fill batches of 30-40 rows: half again as
// many transactions as needed.
const (
	lingerGap = 200 * time.Microsecond
	lingerMax = time.Millisecond
)

// commit appends batch, delivers what it stored and answers every request.
// ctx is h.writeCtx, or a lone publish's context bound by it. The caller
// holds commitMu.
func (h *EventHub) commit(ctx context.Context, batch []*publishReq) {
	evs := make([]Event, len(batch))
	for i, r := range batch {
		evs[i] = r.ev
	}
	res, err := h.store.Append(ctx, evs)
	if err == nil && len(res) != len(evs) {
		err = fmt.Errorf("the store returned %d results for %d events", len(res), len(evs))
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrOutcomeUnknown):
			// The store cannot tell whether it committed (a connection
			// lost, or Close's cancellation, after the batch was sent).
			err = fmt.Errorf("replayd: publish: %w", err)
		case h.writeCtx.Err() != nil:
			// Close cancelled the commit. The cancellation reaches only
			// BEGIN and the inserts (COMMIT runs without it), and a failed
			// transaction is rolled back: nothing was stored.
			err = fmt.Errorf("replayd: publish: %w (the commit was cancelled; nothing was stored)", ErrClosed)
		default:
			// Busy, I/O, a replaced file and the like fail every
			// event alike.
			err = fmt.Errorf("replayd: publish: %w", err)
		}
		for _, r := range batch {
			r.res <- publishRes{err: err}
		}
		return
	}
	fresh := make([]Event, 0, len(evs))
	split := false // a refused event: the others may not be one atomic batch
	for _, r := range res {
		switch {
		case r.Err != nil:
			split = true
		case r.Duplicate:
			h.metrics.duplicate()
		default:
			fresh = append(fresh, r.Event)
		}
	}
	h.metrics.publishedEvents(len(fresh))
	switch {
	case split:
		// Another process may have committed rows between them: deliver
		// each after what lies below it.
		for _, ev := range fresh {
			h.live.Deliver(ev.Sequence-1, []Event{ev}, false)
		}
	case len(fresh) > 0:
		// One atomic batch: sequence order being visibility order, no
		// other row lies between its rows.
		h.live.Deliver(fresh[0].Sequence-1, fresh, false)
	}
	for i, r := range batch {
		if res[i].Err != nil {
			r.res <- publishRes{err: fmt.Errorf("replayd: publish: %w", res[i].Err)}
			continue
		}
		r.res <- publishRes{ev: res[i].Event, dup: res[i].Duplicate}
	}
}
