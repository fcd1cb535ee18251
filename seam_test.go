package replayd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// Both stores of this tree have the optional capabilities the hub's seam
// uses in place of naming them.
var (
	_ storage.Counter        = (*sqlitestore.Store)(nil)
	_ storage.PromptAppender = (*sqlitestore.Store)(nil)
)

// plainStore is a Store with none of the optional capabilities: embedding
// the interface promotes only its methods.
type plainStore struct{ Store }

// CountBetween over a store that is no storage.Counter counts by reading
// pages, and gives Count's answers, before and after a prune.
func TestCountBetweenWithoutCounter(t *testing.T) {
	db, _ := openTestDB(t)
	s, err := NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.(interface{ Close() error }).Close() })
	if _, ok := Store(plainStore{s}).(storage.Counter); ok {
		t.Fatal("plainStore is a Counter")
	}
	ctx := context.Background()
	topics := []string{"", "a", "b", "c"}
	rng := rand.New(rand.NewPCG(33, 2))
	// More than two read pages (countPageEvents) of the global scope.
	for b := range 5 {
		evs := make([]Event, 600)
		for i := range evs {
			evs[i] = Event{EventID: fmt.Sprintf("e%d-%d", b, i), Type: "message", Topic: topics[rng.IntN(len(topics))], Payload: []byte("1")}
		}
		if _, err := s.Append(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	withCount, byReading := &EventLog{store: s}, &EventLog{store: plainStore{s}}
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := withCount.Replay(ctx, "", 0, 1)
	if err != nil || len(first) != 1 {
		t.Fatal(first, err)
	}
	lo := first[0].Sequence
	check := func() {
		t.Helper()
		cases := [][2]int64{{0, head + 1}, {-5, maxSequence}, {0, 0}, {0, 1}, {head, head + 2}, {lo, lo}, {lo + 10, lo + 5}, {0, lo + 1500}}
		for range 200 {
			after := lo - 2 + rng.Int64N(head-lo+4)
			cases = append(cases, [2]int64{after, after + rng.Int64N(head+4-after)})
		}
		for _, c := range cases {
			for _, topic := range topics {
				want, err := withCount.CountBetween(ctx, topic, c[0], c[1])
				if err != nil {
					t.Fatal(err)
				}
				got, err := byReading.CountBetween(ctx, topic, c[0], c[1])
				if err != nil || got != want {
					t.Fatalf("CountBetween(%q, %d, %d) by reading = %d, %v; Count says %d", topic, c[0], c[1], got, err, want)
				}
			}
		}
	}
	check()
	if _, err := s.Prune(ctx, RetentionPolicy{MaxEvents: 1700}); err != nil {
		t.Fatal(err)
	}
	check()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := byReading.CountBetween(cctx, "", 0, maxSequence); err == nil {
		t.Fatal("CountBetween by reading with an ended ctx: no error")
	}
}

// A lone Publish commits on its own goroutine only over a store that says
// its Append returns with its ctx (storage.PromptAppender).
func TestAloneOnlyOverPromptAppender(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	if !h.alone {
		t.Error("the SQLite store's hub does not commit lone publishes itself")
	}
	h2, err := NewWithStore(plainStore{h.store}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	if h2.alone {
		t.Error("a hub over a store that is no PromptAppender commits lone publishes itself")
	}
}
