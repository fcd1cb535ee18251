package replayd

import (
	"context"
	"fmt"

	"github.com/replayd/replayd/storage"
)

// EventLog is the durable, append-only log behind a hub, seen through its
// [Store], in the handler's terms: the reads a transport of one's own
// needs to do what the SSE handler does, with topics checked as Publish
// checks them. A resuming client is told the head (LatestSequence), the
// newest window above its cursor (ReplayLatest), and how many events it
// missed below that window (CountBetween, the count of a gap frame); a
// client that wants every event pages oldest first (Replay). Everywhere a topic names a scope,
// "" is the global scope (every event); a named topic's scope is its own
// events plus broadcasts.
//
// An EventLog is safe for concurrent use. Obtain one with EventHub.Log.
type EventLog struct {
	store Store
}

// Replay returns up to limit of the oldest events visible to topic whose
// sequence is above since, in ascending order. limit <= 0 means 100.
func (l *EventLog) Replay(ctx context.Context, topic string, since int64, limit int) ([]Event, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	p, err := l.store.Read(ctx, storage.ReadRequest{Scope: scopeOf(topic), After: since, Limit: defaultLimit(limit)})
	if err != nil {
		return nil, fmt.Errorf("replayd: replay: %w", err)
	}
	return p.Events, nil
}

// ReplayLatest returns the newest window of up to limit events visible to
// topic whose sequence is above since, in ascending order: what a client
// that fell behind is replayed. limit <= 0 means 100. It reads where the
// window starts and then the window: should retention delete part of it in
// between, it returns what is left.
func (l *EventLog) ReplayLatest(ctx context.Context, topic string, since int64, limit int) ([]Event, error) {
	if err := validateTopic(topic); err != nil {
		return nil, err
	}
	limit = defaultLimit(limit)
	scope := scopeOf(topic)
	w, err := l.store.Window(ctx, scope, max(since, 0), limit)
	if err == nil && w.From > 0 && w.From <= w.Head {
		var p storage.Page
		p, err = l.store.Read(ctx, storage.ReadRequest{Scope: scope, After: max(since, w.From-1), Through: w.Head, Limit: limit})
		if err == nil {
			return p.Events, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("replayd: replay latest: %w", err)
	}
	return nil, nil
}

// CountBetween counts the retained events visible to topic whose sequence
// is strictly between after and before: what a client resuming from after
// missed below before, the start of the window it is replayed. Over a
// store that counts ([storage.Counter]: the SQLite and PostgreSQL stores)
// it is one read of one snapshot; over another it reads the events, page
// by page, and events pruned or appended meanwhile may or may not be
// counted.
func (l *EventLog) CountBetween(ctx context.Context, topic string, after, before int64) (int64, error) {
	if err := validateTopic(topic); err != nil {
		return 0, err
	}
	var (
		n   int64
		err error
	)
	if c, ok := l.store.(storage.Counter); ok {
		n, err = c.Count(ctx, scopeOf(topic), after, before)
	} else {
		n, err = l.countByReading(ctx, scopeOf(topic), after, before)
	}
	if err != nil {
		return 0, fmt.Errorf("replayd: count: %w", err)
	}
	return n, nil
}

// A count by reading reads pages of at most countPageEvents events, cut at
// countPageBytes of payload.
const (
	countPageEvents = 1000
	countPageBytes  = 4 << 20
)

// countByReading is Count over Read, for a store that is no Counter.
func (l *EventLog) countByReading(ctx context.Context, scope []string, after, before int64) (int64, error) {
	if before <= 1 { // sequences are positive: nothing is below 1
		return 0, nil
	}
	through := before - 1
	after = max(after, 0)
	var n int64
	for after < through {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		p, err := l.store.Read(ctx, storage.ReadRequest{Scope: scope, After: after, Through: through, Limit: countPageEvents, MaxBytes: countPageBytes})
		if err != nil {
			return 0, err
		}
		n += int64(len(p.Events))
		if !p.More || len(p.Events) == 0 {
			break
		}
		after = p.Events[len(p.Events)-1].Sequence
	}
	return n, nil
}

// LatestSequence returns the head: the highest sequence ever assigned. It
// never goes backwards, even when retention has deleted every row.
func (l *EventLog) LatestSequence(ctx context.Context) (int64, error) {
	head, err := l.store.Head(ctx)
	if err != nil {
		return 0, fmt.Errorf("replayd: latest sequence: %w", err)
	}
	return head, nil
}

const maxSequence = 1<<63 - 1

func defaultLimit(limit int) int {
	if limit <= 0 {
		return 100
	}
	return limit
}

// scopeOf is the scope of the exported single-topic reads: "" is global.
func scopeOf(topic string) []string {
	if topic == "" {
		return nil
	}
	return []string{topic}
}
