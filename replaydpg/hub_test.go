package replaydpg

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/sseparse"
)

// Two hubs on two stores of one log, as two nodes: what node A publishes
// reaches a subscriber of node B exactly once, in order, woken by NOTIFY
// (B's fallback poll is an hour), and both nodes read the same log.
func TestHubsOnTwoNodes(t *testing.T) {
	dsn, prefix := testDSN(t), testPrefix(t)
	hubsOnTwoNodes(t, func() *Store { return openPrefixDSN(t, prefix, dsn) })
}

// hubsOnTwoNodes is TestHubsOnTwoNodes on the stores open returns (two
// calls, one log).
func hubsOnTwoNodes(t *testing.T, open func() *Store) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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

	if err := hubA.Ready(ctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
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

// A client resuming over SSE from a node on PostgreSQL is replayed exactly
// what it missed (Window, then Read pages), and told of what was pruned.
func TestSSEResumeOnPostgres(t *testing.T) {
	dsn, prefix := testDSN(t), testPrefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Open(ctx, dsn, WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()
	var seqs []int64
	for i := range 10 {
		ev, err := hub.Publish(ctx, "", i)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ev.Sequence)
	}
	if n, err := hub.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 8}); err != nil || n != 2 {
		t.Fatalf("Prune: %d, %v", n, err)
	}
	// Resuming from the first event: the second was pruned, the next four
	// are skipped (ReplayLimit 3), the last three replayed.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	req.Header.Set("Last-Event-ID", strconv.FormatInt(seqs[0], 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var (
		events []string
		ids    []string
	)
	r := sseparse.NewReader(resp.Body)
	var end error
	for len(ids) < 3 {
		f, err := r.Next()
		if err != nil {
			end = err
			break
		}
		if len(f.Event) == 0 {
			continue
		}
		events = append(events, string(f.Event))
		if string(f.Event) == "message" {
			ids = append(ids, string(f.ID))
		}
	}
	want := []string{strconv.FormatInt(seqs[7], 10), strconv.FormatInt(seqs[8], 10), strconv.FormatInt(seqs[9], 10)}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Fatalf("replayed ids %v, want %v (events %v, stream end %v)", ids, want, events, end)
	}
	if !slices.Contains(events, "gap") {
		t.Fatalf("no gap frame before the replay: events %v", events)
	}
}
