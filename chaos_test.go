package replayd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"
)

// The chaos run itself is the package chaostest; TestChaos
// (chaos_sqlite_test.go) runs it on SQLite. Here: its flags, which the
// crash, contention and poll tests share for their seeds, and the tests
// that pinned bugs the chaos suite found, which need the hub's internals.
//
//	go test -run '^TestChaos$' -chaos.seed=42 -chaos.duration=5m .

var (
	chaosSeedFlag     = flag.Uint64("chaos.seed", 0, "seed of TestChaos and TestCrashDurability (0: from the clock)")
	chaosDurationFlag = flag.Duration("chaos.duration", 0, "how long TestChaos runs its chaos phase (0: 20s, 2s with -short)")
)

// chaosSeed returns the seed to use and logs it, so any failure can be
// replayed.
func chaosSeed(t *testing.T) uint64 {
	seed := *chaosSeedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -chaos.seed=%d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: rerun with -run '^%s$' -chaos.seed=%d", seed, t.Name(), seed)
		}
	})
	return seed
}

// chaosServe starts a real HTTP server whose accepted connections have a
// small send buffer, so a client that stops reading backs frames up into
// the hub's per-connection queue quickly.
func chaosServe(t *testing.T, h http.Handler) string {
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = chaosListener{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

type chaosListener struct{ net.Listener }

func (l chaosListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

// TestChaosCatchUpPastMissingSequence pins a hang the chaos suite's reading
// of live.go found. A publish's delivery catches up on rows other processes
// committed below its batch: deliver(after, rows, false) calls catchUp(after, 1000)
// until the live position reaches after. If the sequence after itself holds
// no row (a duplicate event id consumed it, or it was pruned) and 1,000 or
// more rows sit above it when catchUp reads, every page is trimmed to
// nothing and the page is full, so neither the position nor the loop moves:
// the writer goroutine spins forever holding the live lock, and every later
// Publish on the hub, every live delivery and Close hang.
//
// The scenario is deterministic: hub A lags behind hub B (another process's
// writes, no tail); B's retried event id consumes the sequence just below
// A's next row; while A's delivery waits for the live lock (held here by the
// test, as a tail catching up or a Subscribe callback would), B commits
// 1,000 more rows. One process alone hangs the same way when a retried id
// is followed by a group commit of 1,000 or more publishes.
func TestChaosCatchUpPastMissingSequence(t *testing.T) {
	ctx := context.Background()
	db, path := openTestDB(t)
	hubA := newTestHub(t, db, Options{})
	dbB, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dbB.Close() })
	hubB := newTestHub(t, dbB, Options{})
	// A live subscriber: a hub with none skips catching up altogether.
	defer hubA.Subscribe(func(Event) {})()

	first := mustPublish(t, hubA, "", "a1") // A's live position: 1
	mustPublish(t, hubB, "", "b1", WithEventID("retried"))
	if ev := mustPublish(t, hubB, "", "b1 again", WithEventID("retried")); ev.Sequence != first.Sequence+1 {
		t.Fatalf("retry returned %d", ev.Sequence)
	}
	consumed, _ := hubB.LatestSequence(ctx) // the retry consumed this sequence; no row holds it
	if consumed != first.Sequence+2 {
		t.Fatalf("head %d after a retried id; expected the retry to consume %d", consumed, first.Sequence+2)
	}

	resume := hubA.live.HoldDispatch() // A's delivery of its next row waits here
	locked := true
	defer func() {
		if locked {
			resume()
		}
	}()
	published := make(chan error, 1)
	go func() {
		_, err := hubA.Publish(ctx, "", "a2")
		published <- err
	}()
	// Wait for A's row to be committed (its delivery is then blocked).
	deadline := time.Now().Add(waitFor)
	for head, _ := hubA.LatestSequence(ctx); head != consumed+1; head, _ = hubA.LatestSequence(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("A's publish not committed: head %d", head)
		}
		runtime.Gosched()
	}
	// Another process commits 1,000 rows above it.
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := hubB.Publish(ctx, "", map[string]int{"w": w, "i": i}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	resume()
	locked = false

	select {
	case err := <-published:
		if err != nil {
			t.Fatal(err)
		}
		return // delivered: no hang
	case <-time.After(5 * time.Second):
	}
	// Hung. Prune so fewer than a page of rows remain above A's position;
	// the loop then ends, and the hub can be closed.
	if _, err := hubB.Prune(ctx, RetentionPolicy{MaxEvents: 10}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-published:
		t.Errorf("BUG: a Publish on hub A hung for 5s in deliver's catch-up loop (internal/live deliver.go catchUp): sequence %d holds no row "+
			"(consumed by a retried event id) and 1,000 rows lie above it; it returned only after a prune left fewer than a page", consumed)
	case <-time.After(waitFor):
		t.Fatalf("BUG: a Publish on hub A hung in deliver's catch-up loop and did not recover after a prune")
	}
}

// TestChaosCloseUnderPublishers closes hubs while many goroutines publish
// to them. Every Publish must return promptly, with success (the event is
// stored) or ErrClosed (nothing is stored); none may hang on a request the
// closing writer never answered, and no goroutine may outlive Close.
func TestChaosCloseUnderPublishers(t *testing.T) {
	db, _ := openTestDB(t)
	ctx := context.Background()
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	var stored, refused int
	for round := range rounds {
		h, err := New(db, Options{})
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			id  string
			err error
		}
		results := make(chan result, 1<<16)
		started := make(chan struct{}, 1<<16)
		var wg sync.WaitGroup
		for w := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					id := fmt.Sprintf("close-r%d-w%d-%d", round, w, i)
					pctx, cancel := context.WithTimeout(ctx, waitFor)
					_, err := h.Publish(pctx, "", map[string]int{"i": i}, WithEventID(id))
					cancel()
					results <- result{id, err}
					started <- struct{}{}
					if err != nil {
						return
					}
				}
			}()
		}
		for range 64 { // close while the writer is busy
			<-started
		}
		h.Close()
		wg.Wait()
		close(results)
		for r := range results {
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM events WHERE event_id = ?`, r.id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			switch {
			case r.err == nil && n == 1:
				stored++
			case errors.Is(r.err, ErrClosed) && n == 0:
				refused++
			case errors.Is(r.err, context.DeadlineExceeded):
				t.Fatalf("round %d: Publish of %s hung for %v across Close (stored: %v)", round, r.id, waitFor, n == 1)
			default:
				t.Fatalf("round %d: Publish of %s returned %v, and %d rows hold it", round, r.id, r.err, n)
			}
		}
	}
	t.Logf("%d rounds: %d publishes stored, %d refused with ErrClosed, none hung", rounds, stored, refused)
}
