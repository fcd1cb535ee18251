package storetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// model is what the log must hold: the retained events, ascending, and
// each topic's prune watermark ("" for broadcasts). floor is the head when
// the model started, after the stores were opened: the model knows
// nothing of the sequence floor's skipped ranges below it (see
// testSequenceFloor), so its cursors are 0 or at least floor.
type model struct {
	evs   []replayd.Event
	marks map[string]int64
	head  int64
	floor int64
}

// startModel returns the model of the log s opened: no events yet
// (they are added with add), the head as s reads it.
func startModel(t *testing.T, s replayd.Store) *model {
	m := newModel()
	m.head = head(t, s)
	m.floor = m.head
	return m
}

// cursor returns a random cursor of the model: 0, or from the floor to
// extra above the head (above it is foreign).
func (m *model) cursor(rng *rand.Rand, extra int64) int64 {
	if rng.IntN(8) == 0 {
		return 0
	}
	return m.floor + rng.Int64N(m.head-m.floor+extra)
}

// foreign reports whether the cursor c (0 or at least floor) is foreign:
// above the head.
func (m *model) foreign(c int64) bool { return c > m.head }

func newModel() *model { return &model{marks: map[string]int64{}} }

func (m *model) add(evs ...replayd.Event) {
	for _, e := range evs {
		m.evs = append(m.evs, e)
		m.head = max(m.head, e.Sequence)
	}
}

// prunePrefix drops the first n events, raising watermarks.
func (m *model) prunePrefix(n int) {
	for _, e := range m.evs[:n] {
		m.marks[e.Topic] = max(m.marks[e.Topic], e.Sequence)
	}
	m.evs = slices.Clone(m.evs[n:])
}

// pruneWhere drops the events condemned says, raising watermarks; it
// returns how many it dropped.
func (m *model) pruneWhere(condemned func(replayd.Event) bool) int64 {
	var kept []replayd.Event
	var n int64
	for _, e := range m.evs {
		if condemned(e) {
			m.marks[e.Topic] = max(m.marks[e.Topic], e.Sequence)
			n++
			continue
		}
		kept = append(kept, e)
	}
	m.evs = kept
	return n
}

func visible(e replayd.Event, scope []string) bool {
	return len(scope) == 0 || e.Topic == "" || slices.Contains(scope, e.Topic)
}

// above returns the scope's retained events in (after, through].
func (m *model) above(scope []string, after, through int64) []replayd.Event {
	var out []replayd.Event
	for _, e := range m.evs {
		if e.Sequence > after && e.Sequence <= through && visible(e, scope) {
			out = append(out, e)
		}
	}
	return out
}

func (m *model) watermark(scope []string) int64 {
	var w int64
	for topic, s := range m.marks {
		if len(scope) == 0 || topic == "" || slices.Contains(scope, topic) {
			w = max(w, s)
		}
	}
	return w
}

// sameEvent reports whether got is want as stored (CreatedAt compared to
// the millisecond).
func sameEvent(got, want replayd.Event) bool {
	return got.Sequence == want.Sequence && got.EventID == want.EventID && got.Type == want.Type &&
		got.Topic == want.Topic && string(got.Payload) == string(want.Payload) &&
		got.CreatedAt.UnixMilli() == want.CreatedAt.UnixMilli()
}

func seqs(evs []replayd.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Sequence
	}
	return out
}

// randomLog appends n events over both stores in random batches and returns
// the model.
func randomLog(t *testing.T, rng *rand.Rand, s, s2 replayd.Store, n int, prefix string) *model {
	m := startModel(t, s)
	for i := 0; i < n; {
		k := min(1+rng.IntN(6), n-i)
		batch := make([]replayd.Event, k)
		for j := range batch {
			batch[j] = ev(fmt.Sprintf("%s%d", prefix, i+j), topics[rng.IntN(len(topics))], 3+rng.IntN(40))
		}
		st := s
		if rng.IntN(2) == 1 {
			st = s2
		}
		if ta, ok := st.(storage.TxAppender); ok && rng.IntN(3) == 0 {
			m.add(appendInTx(t, ta, batch, rng.IntN(2) == 0)...)
		} else {
			m.add(appendAll(t, st, batch...)...)
		}
		i += k
	}
	return m
}
