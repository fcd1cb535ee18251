package chaostest

// The ledger of what was published, and the timeline of what else happened.

import (
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// entry is what the ledger knows of one sequence.
type entry struct {
	topic, typ, eventID string
	hash                uint64 // of type and data as a client sees them
}

// ledger is every event Publish returned, by sequence.
type ledger struct {
	mu      sync.Mutex
	bySeq   map[int64]entry
	polled  map[int64]uint64   // sequence → hash of type and data as a poll answer carries them
	byID    map[string]int64   // event id → the newest sequence returned for it
	renewed map[int64]struct{} // originals a retry replaced with a new row
}

// frameHash is the hash of an event's type and data as the checker
// compares them.
func frameHash(typ, data string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(typ))
	h.Write([]byte{0})
	h.Write([]byte(data))
	return h.Sum64()
}

func (l *ledger) add(t *testing.T, ev replayd.Event) {
	en := entry{topic: ev.Topic, typ: ev.Type, eventID: ev.EventID, hash: frameHash(ev.Type, string(ev.Payload))}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.bySeq[ev.Sequence]; ok && old != en {
		t.Errorf("Publish returned two different events for sequence %d: %+v and %+v", ev.Sequence, old, en)
	}
	l.bySeq[ev.Sequence] = en
	l.polled[ev.Sequence] = pollHash(ev.Type, ev.Payload)
	l.byID[ev.EventID] = max(l.byID[ev.EventID], ev.Sequence)
}

// seqOf returns the newest sequence returned for event id, 0 if none.
func (l *ledger) seqOf(id string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byID[id]
}

func (l *ledger) max() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m int64
	for s := range l.bySeq {
		m = max(m, s)
	}
	return m
}

// timeline is what the chaos did besides publishing, for traces.
type timeline struct {
	mu      sync.Mutex
	entries []moment
}

// moment is one entry of the timeline, at its time since the start.
type moment struct {
	at   time.Duration
	what string
}

// write writes the moments from shortly before start through stop to b.
func (tl *timeline) write(b *strings.Builder, start, stop time.Duration) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, m := range tl.entries {
		if m.at >= start-200*time.Millisecond && m.at <= stop {
			fmt.Fprintf(b, "  at %v: %s\n", m.at.Round(time.Millisecond), m.what)
		}
	}
}

func (tl *timeline) add(e *env, what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.entries = append(tl.entries, moment{time.Since(e.start), what})
}
