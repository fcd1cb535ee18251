package chaostest

// The ledger of what was published, and the timeline of what else happened.

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/replayd/replayd"
)

// entry is what the ledger knows of one sequence.
type entry struct {
	topic, typ, eventID string
	hash                uint64 // of type and data as an SSE client sees them
	polled              uint64 // of type and data as a poll answer carries them
	size                int    // the payload's bytes, as stored
}

func newEntry(ev replayd.Event) entry {
	return entry{topic: ev.Topic, typ: ev.Type, eventID: ev.EventID,
		hash: frameHash(ev.Type, string(ev.Payload)), polled: pollHash(ev.Type, ev.Payload), size: len(ev.Payload)}
}

// Ledger is the oracle's record of what was published: every event a
// Publish returned, the publishes whose outcome is unknown (their
// publisher died), and rows read from the log while the run went on. Its
// methods are safe for concurrent use; Check reads it once every writer is
// done.
type Ledger struct {
	mu       sync.Mutex
	bySeq    map[int64]entry
	byID     map[string]int64   // event id → the newest sequence returned for it
	renewed  map[int64]struct{} // originals a retry replaced with a new row
	attempts map[string]entry   // event id → what was tried, outcome unknown
	logged   map[int64]entry    // rows read from the log during the run
	max      int64              // the newest sequence published or logged
	min      int64              // the oldest sequence published or logged; 0: none yet
	errs     []string
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{
		bySeq:    map[int64]entry{},
		byID:     map[string]int64{},
		renewed:  map[int64]struct{}{},
		attempts: map[string]entry{},
		logged:   map[int64]entry{},
	}
}

// Published records ev, which a Publish returned (in this process or in
// another, which reported it). Two different events for one sequence are
// a violation.
func (l *Ledger) Published(ev replayd.Event) {
	en := newEntry(ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.bySeq[ev.Sequence]; ok && old != en {
		l.errs = append(l.errs, fmt.Sprintf("Publish returned two different events for sequence %d: %+v and %+v", ev.Sequence, old, en))
	}
	l.bySeq[ev.Sequence] = en
	l.byID[ev.EventID] = max(l.byID[ev.EventID], ev.Sequence)
	l.max = max(l.max, ev.Sequence)
	l.min = minSeq(l.min, ev.Sequence)
}

// minSeq is min for a min that is 0 when nothing is recorded.
func minSeq(cur, seq int64) int64 {
	if cur == 0 {
		return seq
	}
	return min(cur, seq)
}

// Attempted records a publish of ev (its Sequence ignored) whose outcome
// may never be known: its publisher may be killed before Publish returns.
// It needs an event id. Check takes a row of the log with that id and the
// same topic, type and payload for a published event; no other row may
// appear in the log unpublished.
func (l *Ledger) Attempted(ev replayd.Event) {
	en := newEntry(ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts[ev.EventID] = en
}

// Logged records a row read from the log while the run goes on (it may
// be pruned before the end): Check holds it to what was published or
// attempted, and knows it when a client receives it.
func (l *Ledger) Logged(ev replayd.Event) {
	en := newEntry(ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.logged[ev.Sequence]; ok && old != en {
		l.errs = append(l.errs, fmt.Sprintf("the log held two different rows at sequence %d: %+v and %+v", ev.Sequence, old, en))
	}
	l.logged[ev.Sequence] = en
	l.max = max(l.max, ev.Sequence)
	l.min = minSeq(l.min, ev.Sequence)
}

// Renewed records that a publish retrying the event id of event prior
// stored a new row: Check confirms that prior is gone from the log.
func (l *Ledger) Renewed(prior int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewed[prior] = struct{}{}
}

// SeqOf returns the newest sequence published for event id, 0 if none.
func (l *Ledger) SeqOf(id string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byID[id]
}

// Max returns the newest sequence published or logged so far: one known
// committed, so that a head read after it is at least Max.
func (l *Ledger) Max() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.max
}

// Stale returns a random cursor from just below the oldest sequence
// recorded to the newest (0 if none): a cursor of this log's history,
// unless it falls in a range the sequence floor skipped (a hub opened
// meanwhile), where the log never issued it.
func (l *Ledger) Stale(rng *rand.Rand) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.min == 0 {
		return 0
	}
	return l.min - 1 + rng.Int64N(l.max-l.min+2)
}

// Last returns the newest sequence published or logged that scope (its
// topics; none: the global scope) sees, 0 if none.
func (l *Ledger) Last(scope []string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last int64
	for _, m := range []map[int64]entry{l.bySeq, l.logged} {
		for s, en := range m {
			if s > last && visible(scope, en.topic) {
				last = s
			}
		}
	}
	return last
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

// pollHash is the hash of an event's type and data as a poll answer
// carries them: the stored JSON, compacted by encoding/json.
func pollHash(typ string, payload json.RawMessage) uint64 {
	b, err := json.Marshal(payload)
	if err != nil {
		return 0
	}
	return frameHash(typ, string(b))
}

// Timeline is what a run did besides publishing (restarts, kills,
// prunes), for the traces of violations. Safe for concurrent use.
type Timeline struct {
	// Start is the run's start; every time in a trace is since Start.
	Start time.Time

	mu      sync.Mutex
	entries []moment
}

// NewTimeline returns a timeline starting now.
func NewTimeline() *Timeline { return &Timeline{Start: time.Now()} }

// Since returns the time since the start, as records note it.
func (tl *Timeline) Since() time.Duration { return time.Since(tl.Start) }

// Add notes what happened now.
func (tl *Timeline) Add(what string) {
	at := tl.Since()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.entries = append(tl.entries, moment{at, what})
}

// moment is one entry of the timeline, at its time since the start.
type moment struct {
	at   time.Duration
	what string
}

// write writes the moments from shortly before start through stop to b.
func (tl *Timeline) write(b *strings.Builder, start, stop time.Duration) {
	if tl == nil {
		return
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, m := range tl.entries {
		if m.at >= start-200*time.Millisecond && m.at <= stop {
			fmt.Fprintf(b, "  at %v: %s\n", m.at.Round(time.Millisecond), m.what)
		}
	}
}
