package replaydpg

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// Two hubs on two stores of one log, as two nodes: what node A publishes
// reaches a subscriber of node B exactly once, in order, woken by NOTIFY
// (B's fallback poll is an hour), and both nodes read the same log.
func TestHubsOnTwoNodes(t *testing.T) {
	dsn, prefix := testDSN(t), testPrefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	open := func() *Store {
		s, err := Open(ctx, dsn, WithTablePrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	hubA, err := replayd.NewWithStore(open(), replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer hubA.Close()
	hubB, err := replayd.NewWithStore(open(), replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer hubB.Close()

	var (
		mu  sync.Mutex
		got []int64
	)
	arrived := make(chan struct{}, 1)
	defer hubB.Subscribe(func(ev replayd.Event) {
		mu.Lock()
		got = append(got, ev.Sequence)
		mu.Unlock()
		select {
		case arrived <- struct{}{}:
		default:
		}
	})()
	stop, err := hubB.StartTail(time.Hour, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	var want []int64
	for i := range 20 {
		topic := []string{"a", "b", ""}[i%3]
		ev, err := hubA.Publish(ctx, topic, map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ev.Sequence)
	}
	deadline := time.After(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= len(want) {
			break
		}
		select {
		case <-arrived:
		case <-deadline:
			t.Fatalf("node B got %d of %d events within 10s (its fallback poll is an hour: NOTIFY did not wake it)", n, len(want))
		}
	}
	mu.Lock()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("node B delivered %v, want %v", got, want)
	}
	mu.Unlock()

	// Both nodes read the same log through EventLog.
	for _, h := range []*replayd.EventHub{hubA, hubB} {
		evs, err := h.Log().ReplayLatest(ctx, "a", 0, 3)
		if err != nil || len(evs) != 3 || evs[2].Sequence != want[18] {
			t.Fatalf("ReplayLatest: %v, %v", evs, err)
		}
		n, err := h.Log().CountBetween(ctx, "b", 0, want[19]+1)
		if err != nil || n != 13 { // of b (i%3 == 1): 7, broadcasts (i%3 == 2): 6
			t.Fatalf("CountBetween: %d, %v", n, err)
		}
		head, err := h.LatestSequence(ctx)
		if err != nil || head != want[19] {
			t.Fatalf("LatestSequence: %d, %v", head, err)
		}
	}
}
