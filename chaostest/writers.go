package chaostest

// The writers: publishers, pruners, restarts, and in-process subscribers.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// publish publishes on h and records the result in the ledger; an error
// fails the test.
func (e *env) publish(h *replayd.EventHub, topic string, payload any, opts ...replayd.PublishOption) replayd.Event {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	ev, err := h.Publish(ctx, topic, payload, opts...)
	if err != nil {
		e.t.Errorf("publish on hub A: %v", err)
		return ev
	}
	e.ledger.Published(ev)
	return ev
}

// prefill publishes n events on hub A from many goroutines at once.
func (e *env) prefill(n int) {
	const workers = 32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				topic := ""
				if i%7 != 0 {
					topic = allTopics[i%len(allTopics)]
				}
				e.publish(e.hubA, topic, map[string]int{"prefill": i})
			}
		}()
	}
	wg.Wait()
}

// publisher publishes until the chaos phase ends: random topics and
// broadcasts, random types, multi-line payloads, some with an event id,
// some of those retried (at once, or much later, perhaps after the
// original was pruned), and some through hub B.
func (e *env) publisher(p int, rng *rand.Rand) {
	var ids []string // event ids used, for retries
	for n := 0; ; n++ {
		select {
		case <-e.stop:
			return
		default:
		}
		topic := allTopics[rng.IntN(len(allTopics))]
		if rng.IntN(6) == 0 {
			topic = ""
		}
		typ := []string{"message", "update", "note.created"}[rng.IntN(3)]
		payload := drawPayload(rng, p, n)
		var opts []replayd.PublishOption
		opts = append(opts, replayd.WithType(typ))
		retry, prior := "", int64(0)
		switch r := rng.IntN(20); {
		case r < 3:
			id := fmt.Sprintf("pub%d-%d", p, n)
			ids = append(ids, id)
			opts = append(opts, replayd.WithEventID(id))
		case r < 5 && len(ids) > 0:
			retry = ids[rng.IntN(len(ids))]
			if rng.IntN(2) == 0 {
				retry = ids[len(ids)-1]
			}
			prior = e.ledger.SeqOf(retry)
			opts = append(opts, replayd.WithEventID(retry))
		}
		if e.cfg.Transactions && retry == "" && rng.IntN(12) == 0 {
			e.publishTx(p, n, rng, topic, payload, opts)
			e.stats.publishes.Add(1)
			continue
		}
		var ev replayd.Event
		if rng.IntN(10) == 0 {
			// Through hub B, which may be restarting: an event id makes
			// the retry safe.
			if retry == "" {
				id := fmt.Sprintf("pubB%d-%d", p, n)
				opts = append(opts, replayd.WithEventID(id))
			}
			ev = e.publishB(topic, payload, opts)
		} else {
			ev = e.publish(e.hubA, topic, payload, opts...)
		}
		if retry != "" && ev.Sequence > 0 && prior > 0 {
			e.noteRetry(retry, prior, ev)
		}
		e.stats.publishes.Add(1)
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // pacing, not synchronisation
		}
	}
}

// publishB publishes through the current hub B, retrying on a hub that a
// restart closed.
func (e *env) publishB(topic string, payload any, opts []replayd.PublishOption) replayd.Event {
	e.stats.publishB.Add(1)
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		ev, err := e.hubB.Load().Publish(ctx, topic, payload, opts...)
		cancel()
		if errors.Is(err, replayd.ErrClosed) {
			continue // the restarter has stored a new hub before closing the old one
		}
		if err != nil {
			e.t.Errorf("publish on hub B: %v", err)
			return ev
		}
		e.ledger.Published(ev)
		return ev
	}
	e.t.Errorf("publish on hub B: closed 100 times in a row")
	return replayd.Event{}
}

// noteRetry checks a publish that reused an event id whose newest row was
// prior: it returns that row, unless the row was pruned meanwhile, when it
// stores a new one (the check at the end confirms prior is gone).
func (e *env) noteRetry(id string, prior int64, ev replayd.Event) {
	e.stats.retries.Add(1)
	switch {
	case ev.EventID != id:
		e.t.Errorf("retry of %s returned event %s", id, ev.EventID)
	case ev.Sequence == prior:
		e.stats.retriesSame.Add(1)
	case ev.Sequence > prior:
		e.stats.retriesNew.Add(1)
		e.ledger.Renewed(prior)
	default:
		e.t.Errorf("retry of %s returned %d, below its row %d", id, ev.Sequence, prior)
	}
}

// drawPayload is a JSON object naming its publisher, sometimes padded,
// sometimes spread over several lines.
func drawPayload(rng *rand.Rand, p, n int) json.RawMessage {
	pad := strings.Repeat("x", rng.IntN(400))
	if rng.IntN(8) == 0 {
		return json.RawMessage(fmt.Sprintf("{\n  \"p\": %d,\n  \"n\": %d,\n  \"pad\": %q\n}", p, n, pad))
	}
	return json.RawMessage(fmt.Sprintf(`{"p":%d,"n":%d,"pad":%q}`, p, n, pad))
}

// bigBurst publishes on hub A six events of 1 MiB on one topic, between
// the storm phase and the chaos phase: a poll paging over them while they
// are retained gets an answer cut at 4 MiB of payload (four events, more
// true), and an SSE replay over them gets frames far above hub
// A's MaxBufferedBytes. Once, and before any client is live: every client
// of the topic that is sent them moves each byte several times, and under
// the race detector bursts during the chaos phase slowed the run threefold.
func (e *env) bigBurst(rng *rand.Rand) {
	topic := allTopics[rng.IntN(len(allTopics))]
	pad := strings.Repeat("x", 1<<20-64)
	for i := range 6 {
		e.publish(e.hubA, topic, json.RawMessage(fmt.Sprintf(`{"big":%d,"pad":%q}`, i, pad)), replayd.WithType("update"))
	}
	e.stats.bigEvents.Add(6)
	e.timeline.Add(fmt.Sprintf("burst: six events of 1 MiB on %q", topic))
}

// pruner calls Prune on either hub, by count or by age, until the chaos
// phase ends.
func (e *env) pruner(rng *rand.Rand) {
	for {
		wait := time.NewTimer(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		select {
		case <-e.stop:
			wait.Stop()
			return
		case <-wait.C:
		}
		var policy replayd.RetentionPolicy
		switch rng.IntN(10) {
		case 0, 1, 2:
			policy.MaxAge = time.Duration(500+rng.IntN(6000)) * time.Millisecond
		case 3:
			// Nearly everything: rows a tailing hub has not read yet go too.
			policy.MaxEvents = int64(1 + rng.IntN(10))
		default:
			policy.MaxEvents = int64(50 + rng.IntN(3000))
		}
		if e.cfg.TopicRetention {
			policy.Topics = topicPolicies(rng)
		}
		h, name := e.hubA, "A"
		if rng.IntN(3) == 0 {
			h, name = e.hubB.Load(), "B"
		}
		n, err := h.Prune(context.Background(), policy)
		if err != nil && !errors.Is(err, replayd.ErrClosed) {
			e.t.Errorf("prune on hub %s: %v", name, err)
		}
		e.stats.pruneCalls.Add(1)
		e.stats.pruned.Add(n)
		e.timeline.Add(fmt.Sprintf("prune on hub %s %+v: %d deleted", name, policy, n))
	}
}

// topicPolicies are Config.TopicRetention's entries: t0 by its own
// limits, t1 never pruned.
func topicPolicies(rng *rand.Rand) []replayd.TopicPolicy {
	t0 := replayd.TopicPolicy{Topic: "t0"}
	if rng.IntN(2) == 0 {
		t0.MaxEvents = int64(1 + rng.IntN(10))
	} else {
		t0.MaxAge = time.Duration(200+rng.IntN(800)) * time.Millisecond
	}
	return []replayd.TopicPolicy{{Topic: "t1"}, t0}
}

// topicPruner prunes t0 every second (Config.TopicRetention), on hub A or
// B: by its policy alone (the default has no limit), or all of it with
// PruneTopic, one time in four.
func (e *env) topicPruner(rng *rand.Rand) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		h, name := e.hubA, "A"
		if rng.IntN(3) == 0 {
			h, name = e.hubB.Load(), "B"
		}
		var (
			n    int64
			err  error
			what string
		)
		if rng.IntN(4) == 0 {
			n, err = h.PruneTopic(context.Background(), "t0", math.MaxInt64)
			what = "PruneTopic t0"
		} else {
			policy := replayd.RetentionPolicy{Topics: topicPolicies(rng)}
			n, err = h.Prune(context.Background(), policy)
			what = fmt.Sprintf("prune %+v", policy)
		}
		if err != nil && !errors.Is(err, replayd.ErrClosed) {
			e.t.Errorf("%s on hub %s: %v", what, name, err)
		}
		e.stats.pruneCalls.Add(1)
		e.stats.pruned.Add(n)
		e.timeline.Add(fmt.Sprintf("%s on hub %s: %d deleted", what, name, n))
	}
}

// restarter replaces hub B with a new one now and then (closing the old
// one ends its streams) and, now and then, ends every stream of hub A: the
// hub itself (Config.Disconnect) or its listener closing every connection.
// It returns the subscriber of the last hub B.
func (e *env) restarter(rng *rand.Rand, sub *Subscriber) *Subscriber {
	for {
		wait := time.NewTimer(time.Duration(700+rng.IntN(2500)) * time.Millisecond)
		select {
		case <-e.stop:
			wait.Stop()
			return sub
		case <-wait.C:
		}
		if rng.IntN(3) == 0 {
			if e.cfg.Disconnect != nil && rng.IntN(2) == 0 {
				e.cfg.Disconnect(e.hubA)
				e.stats.resyncs.Add(1)
				e.timeline.Add("hub A disconnects every stream")
			} else {
				n := e.connsA.closeAll()
				e.stats.kills.Add(1)
				e.timeline.Add(fmt.Sprintf("hub A's listener closes its %d connections", n))
			}
			continue
		}
		h, closeHub, next, err := e.newHubB(rng)
		if err != nil {
			e.t.Errorf("restart hub B: %v", err)
			continue
		}
		sub = next
		e.hubB.Store(h) // before closing the old one: publishB retries on ErrClosed
		e.closeB()
		e.closeB = closeHub
		e.stats.restarts.Add(1)
		e.timeline.Add("hub B restarted")
	}
}

// waitSub waits until s has seen through, bounded.
func waitSub(t *testing.T, s *Subscriber, through int64) {
	t.Helper()
	if ok, last := s.Wait(through, waitFor); !ok {
		t.Errorf("hub %s subscriber stuck at %d, waiting for %d", s.Name, last, through)
	}
}
