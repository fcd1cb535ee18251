package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replayd/replayd/storage"
)

// The sweep: what deleted and expired streams leave behind is reclaimed.
//
// A stream nothing reads any more (deleted, or expired, with no fork
// reading it) becomes a tombstone in the same transaction (bury): its
// record is replaced by one that is absent to every request and names the
// sequence through which the topic's events are the dead incarnation's
// (meta.Reclaim: the ds.delete marker, or the topic's newest event when it
// expired), and its producers' state goes. The sweep then prunes the topic
// through that sequence (storage.TopicPruner, a prefix of the topic: never
// what a stream created again at the path appended above it) and, in a
// transaction that checks the record still names the same sequence,
// deletes the tombstone. A stream created again at the path before the
// sweep came takes the tombstone's Reclaim over; the sweep prunes the same
// prefix and clears it. A stream that forks read is kept (soft-deleted, or
// expired and 410) until the last of them goes, whose deletion buries it
// (unfork): a fork's chain names segments of its sources' topics, and no
// prune reaches them while the fork lives.
//
// The records the sweep must look at are due (meta.due, the record's
// ExpiresAt): StreamStore.DueStreams lists them. Every step is checked
// again in a stream transaction (the topic's lock), and pruning is
// idempotent, so any number of sweeps (two nodes on one PostgreSQL, a
// request that creates a stream over an expired one) may run at once.

// Sweeper reclaims deleted and expired streams' records and events.
type Sweeper struct {
	Store storage.StreamStore
	// Prune deletes a topic's events with a sequence at or below through
	// (EventHub.PruneTopic). Nil: the store cannot (no
	// storage.TopicPruner); the records are still collected, the events
	// are left to retention.
	Prune func(ctx context.Context, topic string, through int64) (int64, error)
	Now   func() time.Time
}

// maxSteps bounds the steps of one visit (bury, prune, collect): more
// would mean the record keeps changing under the sweep.
const maxSteps = 4

// Round lists at most batch due records and does what each needs, and
// what the sources a buried fork released need. It returns how many
// records it listed and how many events it pruned; errors of single
// streams are joined (the others are still swept).
func (s *Sweeper) Round(ctx context.Context, batch int) (listed int, pruned int64, err error) {
	recs, err := s.Store.DueStreams(ctx, s.Now().UnixMilli(), batch)
	if err != nil {
		return 0, 0, err
	}
	queue := make([]string, 0, len(recs))
	for _, rec := range recs {
		queue = append(queue, rec.Topic)
	}
	seen := make(map[string]bool, len(queue))
	var errs []error
	for len(queue) > 0 {
		topic := queue[0]
		queue = queue[1:]
		if seen[topic] {
			continue
		}
		seen[topic] = true
		n, released, err := s.visit(ctx, topic)
		pruned += n
		if err != nil {
			if ctx.Err() != nil {
				return len(recs), pruned, ctx.Err()
			}
			errs = append(errs, fmt.Errorf("stream %q: %w", topic, err))
		}
		queue = append(queue, released...)
	}
	return len(recs), pruned, errors.Join(errs...)
}

// visit does what topic's record needs now, step by step: bury it if it
// expired with no fork reading it, then reclaim what it names, or move
// its due time. It returns the events pruned and, when it buried a fork,
// the fork's sources (which may have been collected too).
func (s *Sweeper) visit(ctx context.Context, topic string) (pruned int64, released []string, err error) {
	for range maxSteps {
		page, err := s.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: topic, Limit: 1, MaxBytes: 1})
		if err != nil || !page.Found {
			return pruned, released, err
		}
		m, err := decodeMeta(page.Record)
		if err != nil {
			return pruned, released, err
		}
		now := s.Now()
		switch {
		case m.Reclaim > 0 || m.Tomb:
			n, err := s.reclaim(ctx, topic, m.Reclaim)
			if pruned += n; err != nil {
				return pruned, released, err
			}
		case !m.Tomb && m.Forks == 0 && m.state(now) != alive:
			if err := s.bury(ctx, topic, m); err != nil {
				return pruned, released, err
			}
			released = append(released, m.Parents...)
		case page.Record.ExpiresAt != m.due(now):
			// Due, but forks hold it: due again when they are gone.
			return pruned, released, s.update(ctx, []string{topic}, func(t *txn) error {
				cur, _, err := t.stream(ctx, topic)
				if err != nil || cur == nil || cur.Base != m.Base || cur.Tomb {
					return err
				}
				return t.put(ctx, topic, cur)
			})
		default:
			return pruned, released, nil
		}
	}
	return pruned, released, nil
}

// reclaim prunes topic's events through through, then clears the
// record's Reclaim (deletes a tombstone), if it still names through.
func (s *Sweeper) reclaim(ctx context.Context, topic string, through int64) (int64, error) {
	var n int64
	if s.Prune != nil && through > 0 {
		var err error
		if n, err = s.Prune(ctx, topic, through); err != nil {
			return n, err
		}
	}
	return n, s.update(ctx, []string{topic}, func(t *txn) error {
		cur, _, err := t.stream(ctx, topic)
		switch {
		case err != nil || cur == nil || cur.Reclaim != through:
			return err // gone, or buried again meanwhile: a later step's
		case cur.Tomb:
			return t.DeleteStream(ctx, topic)
		}
		cur.Reclaim = 0
		return t.put(ctx, topic, cur)
	})
}

// bury buries the expired stream m of topic, read outside a transaction,
// if it is still that stream, expired with no fork reading it.
func (s *Sweeper) bury(ctx context.Context, topic string, m *meta) error {
	return s.update(ctx, append([]string{topic}, m.Parents...), func(t *txn) error {
		cur, st, err := t.stream(ctx, topic)
		if err != nil || cur == nil || cur.Tomb || cur.Base != m.Base || cur.Forks != 0 || st == alive {
			return err
		}
		last, err := t.Last(ctx, topic)
		if err != nil {
			return err
		}
		if err := t.bury(ctx, topic, cur, last); err != nil {
			return err
		}
		return t.unfork(ctx, cur)
	})
}

// buryExpired buries topic's stream if it expired with no fork reading it
// (a create over it needs its tombstone).
func (s *Sweeper) buryExpired(ctx context.Context, topic string) error {
	page, err := s.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: topic, Limit: 1, MaxBytes: 1})
	if err != nil || !page.Found {
		return err
	}
	m, err := decodeMeta(page.Record)
	if err != nil {
		return err
	}
	return s.bury(ctx, topic, m)
}

// update runs fn in a stream transaction of topics.
func (s *Sweeper) update(ctx context.Context, topics []string, fn func(t *txn) error) error {
	return s.Store.UpdateStreams(ctx, topics, func(tx storage.StreamTx) error {
		return fn(&txn{StreamTx: tx, now: s.Now()})
	})
}

// bury replaces the record of topic, the stream m that nothing reads any
// more, by its tombstone, which reclaims the topic's events through
// through (and what m had to reclaim), and drops its producers' state.
func (t *txn) bury(ctx context.Context, topic string, m *meta, through int64) error {
	if err := t.DeleteStream(ctx, topic); err != nil {
		return err
	}
	tomb := &meta{Base: m.Base, Created: m.Created, Tomb: true, Reclaim: max(m.Reclaim, through)}
	return t.put(ctx, topic, tomb)
}

// sweeper is the Sweeper of h's store and clock.
func (h *Handler) sweeper() *Sweeper {
	return &Sweeper{Store: h.Store, Prune: h.Prune, Now: h.Now}
}
