package storetest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// Pruning every event leaves the head where it was, and the next append
// goes above it.
func testHeadAfterPruneAll(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	var last replayd.Event
	for i := range 5 {
		last = appendAll(t, s, ev(fmt.Sprintf("p%d", i), topics[i%len(topics)], 8))[0]
	}
	waitClock(t, last.CreatedAt, 20*time.Millisecond)
	n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxAge: 5 * time.Millisecond})
	if err != nil || n != 5 {
		t.Fatalf("Prune everything: %d, %v", n, err)
	}
	if h := head(t, s); h != last.Sequence {
		t.Fatalf("head %d after pruning everything, was %d", h, last.Sequence)
	}
	p := read(t, s2, storage.ReadRequest{Limit: 10})
	if len(p.Events) != 0 || p.Head != last.Sequence || p.Watermark != last.Sequence {
		t.Fatalf("after pruning everything: %+v", p)
	}
	next := appendAll(t, s2, ev("next", "", 3))[0]
	if next.Sequence <= last.Sequence {
		t.Fatalf("sequence %d after a pruned head %d", next.Sequence, last.Sequence)
	}
}

// MaxEvents keeps the newest MaxEvents of the whole log and deletes a
// prefix, raising each topic's watermark to the highest sequence deleted of
// it; a second store sees the same.
func testPruneByCount(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	rng := rand.New(rand.NewPCG(5, 6))
	m := randomLog(t, rng, s, s2, 2600, "c") // more than one prune batch
	n, err := s.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 100})
	if err != nil || n != 2500 {
		t.Fatalf("Prune: %d, %v; want 2500", n, err)
	}
	m.prunePrefix(2500)
	for _, scope := range scopes {
		checkRead(t, s2, m, storage.ReadRequest{Scope: scope, Limit: 1000})
	}
	if n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 100}); err != nil || n != 0 {
		t.Fatalf("Prune again: %d, %v", n, err)
	}
	if n, err := s2.Prune(ctxT(t), replayd.RetentionPolicy{}); err != nil || n != 0 {
		t.Fatalf("Prune with no limit: %d, %v", n, err)
	}
	// Watermarks never go down.
	n, err = s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 99})
	if err != nil || n != 1 {
		t.Fatalf("Prune one more: %d, %v", n, err)
	}
	m.prunePrefix(1)
	for _, scope := range scopes {
		checkRead(t, s, m, storage.ReadRequest{Scope: scope, Limit: 1000})
	}
}

// MaxAge deletes the events created before now-MaxAge: a prefix, since
// created_at never decreases.
func testPruneByAge(t *testing.T, open func() replayd.Store) {
	s, s2 := open(), open()
	m := newModel()
	var old []replayd.Event
	for i := range 8 {
		old = append(old, appendAll(t, s, ev(fmt.Sprintf("old%d", i), topics[i%len(topics)], 5))...)
	}
	m.add(old...)
	waitClock(t, old[len(old)-1].CreatedAt, 300*time.Millisecond)
	young := appendAll(t, s2, ev("young1", "a", 5), ev("young2", "", 5))
	m.add(young...)
	// Old events are >= 300ms old, young ones about 0: cut at about 150ms.
	maxAge := time.Since(young[0].CreatedAt) + 150*time.Millisecond
	n, err := s.Prune(ctxT(t), replayd.RetentionPolicy{MaxAge: maxAge})
	if err != nil || n != int64(len(old)) {
		t.Fatalf("Prune MaxAge %v: %d, %v; want %d", maxAge, n, err, len(old))
	}
	m.prunePrefix(len(old))
	for _, scope := range scopes {
		checkRead(t, s2, m, storage.ReadRequest{Scope: scope, Limit: 100})
	}
	// Both limits: whichever deletes more.
	n, err = s2.Prune(ctxT(t), replayd.RetentionPolicy{MaxEvents: 1, MaxAge: time.Hour})
	if err != nil || n != 1 {
		t.Fatalf("Prune MaxEvents 1, MaxAge 1h: %d, %v", n, err)
	}
	m.prunePrefix(1)
	checkRead(t, s, m, storage.ReadRequest{Limit: 100})
}
