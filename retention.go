package replayd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/replayd/replayd/storage"
)

// Prune deletes the events policy condemns: all but the newest MaxEvents,
// and those older than MaxAge, whichever deletes more, of the whole log,
// or, with policy.Topics, of each topic by the first entry that matches it
// and of the rest of the log by MaxEvents and MaxAge (see RetentionPolicy
// and docs/operations.md, "Retention per topic"). It works in batches
// of at most 1,000 rows, each its own short transaction, so publishers are
// never stalled for long, and records each topic's prune watermark in the
// same transaction as its delete, so a client that reconnects below it gets
// a "pruned" gap. It returns how many rows it deleted. On a closed hub it
// deletes nothing and returns ErrClosed; a prune that Close overtakes and
// whose store then fails returns ErrClosed too.
func (h *EventHub) Prune(ctx context.Context, policy RetentionPolicy) (deleted int64, err error) {
	if h.isClosed() {
		return 0, ErrClosed
	}
	deleted, err = h.store.Prune(ctx, policy)
	h.metrics.pruned(deleted)
	switch {
	case err != nil && h.isClosed():
		// The store's owner closes it after the hub: its error says no more
		// than that.
		return deleted, fmt.Errorf("replayd: prune: %w: %w", ErrClosed, err)
	case err != nil:
		return deleted, fmt.Errorf("replayd: prune: %w", err)
	}
	return deleted, nil
}

// PruneTopic deletes every event of topic with a sequence at or below
// through (math.MaxInt64: all of them so far), raising the topic's prune
// watermark, so that a client of the topic that resumes below it gets a
// pruned gap: what a Durable Stream's deletion or TTL, or a finished job
// stream, needs. It is the primitive per-topic policies are made of, for a
// caller that decides itself what a topic keeps; events appended after it
// began are never deleted. The store must be a storage.TopicPruner (both
// of replayd's are); otherwise PruneTopic deletes nothing and returns an
// error wrapping errors.ErrUnsupported. topic "" (the broadcasts) is
// ErrInvalid. Otherwise it is as Prune.
func (h *EventHub) PruneTopic(ctx context.Context, topic string, through int64) (deleted int64, err error) {
	if h.isClosed() {
		return 0, ErrClosed
	}
	tp, ok := h.store.(storage.TopicPruner)
	if !ok {
		return 0, fmt.Errorf("replayd: prune topic: the store (%T) is no storage.TopicPruner: %w", h.store, errors.ErrUnsupported)
	}
	if topic == "" {
		return 0, fmt.Errorf("replayd: prune topic: %w: the broadcasts are pruned by Prune's default", ErrInvalid)
	}
	if err := validateTopic(topic); err != nil {
		return 0, fmt.Errorf("replayd: prune topic: %w", err)
	}
	deleted, err = tp.PruneTopic(ctx, topic, through)
	h.metrics.pruned(deleted)
	switch {
	case err != nil && h.isClosed():
		return deleted, fmt.Errorf("replayd: prune topic: %w: %w", ErrClosed, err)
	case err != nil:
		return deleted, fmt.Errorf("replayd: prune topic: %w", err)
	}
	return deleted, nil
}

// defaultRetentionInterval is StartRetention's interval when given none.
const defaultRetentionInterval = time.Hour

// StartRetention prunes by policy now and then every interval (<= 0: 1h)
// until stop is called or the hub is closed. Errors are logged and retried
// at the next tick. stop waits for a prune in progress to end; it is safe
// to call more than once.
func (h *EventHub) StartRetention(policy RetentionPolicy, interval time.Duration) (stop func()) {
	if interval <= 0 {
		interval = defaultRetentionInterval
	}
	ctx, cancel := context.WithCancel(h.ctx)
	exited := make(chan struct{})
	err := h.goLoop(func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			n, err := h.Prune(ctx, policy)
			switch {
			case err != nil && ctx.Err() == nil:
				h.logger.Error("replayd: scheduled prune failed", "deleted", n, "err", err)
			case n > 0:
				h.logger.Info("replayd: pruned events", "deleted", n)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	if err != nil {
		close(exited)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-exited
		})
	}
}
