package sqlitestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/storage"
)

// appendLoop appends one row of topic at a time until stop is closed, and
// returns how many it appended once it stopped.
func appendLoop(t *testing.T, s *Store, topic string, stop <-chan struct{}) func() int64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ev := storage.Event{EventID: fmt.Sprintf("%s-%d", topic, n.Load()), Type: "m", Topic: topic, Payload: json.RawMessage(`{}`)}
			if _, err := s.Append(context.Background(), []storage.Event{ev}); err != nil {
				t.Errorf("append while pruning: %v", err)
				return
			}
			n.Add(1)
		}
	}()
	return func() int64 { wg.Wait(); return n.Load() }
}

func countTopic(t *testing.T, s *Store, topic string) (n int64) {
	t.Helper()
	if err := s.db.QueryRow(`SELECT count(*) FROM events WHERE topic = ?`, topic).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// While this process appends, a per-topic prune's chunks ride the
// appends' commits: it deletes exactly the topic's rows, none of the
// appends', and every append succeeds.
func TestPruneTopicRidesAppends(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	const bulk = 3000
	batch := make([]storage.Event, 500)
	for i := 0; i < bulk; i += len(batch) {
		for j := range batch {
			batch[j] = storage.Event{EventID: fmt.Sprintf("bulk-%d", i+j), Type: "m", Topic: "bulk", Payload: json.RawMessage(`{}`)}
		}
		if _, err := s.Append(t.Context(), batch); err != nil {
			t.Fatal(err)
		}
	}
	var rides atomic.Int64
	s.testHookPruneChunk = func(_ int64, r int) { rides.Store(int64(r)) }
	stop := make(chan struct{})
	appended := appendLoop(t, s, "p", stop)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n, err := s.PruneTopic(ctx, "bulk", math.MaxInt64)
	close(stop)
	kept := appended()
	if err != nil || n != bulk {
		t.Fatalf("PruneTopic = %d, %v; want %d", n, err, bulk)
	}
	if rides.Load() == 0 {
		t.Error("no chunk of the prune rode an append's commit")
	}
	if got := countTopic(t, s, "bulk"); got != 0 {
		t.Errorf("%d rows of the pruned topic left", got)
	}
	if got := countTopic(t, s, "p"); got != kept {
		t.Errorf("%d rows of the appended topic, want %d", got, kept)
	}
	t.Logf("%d rows pruned, %d chunks rode %d appends", n, rides.Load(), kept)
}

// A prune whose ctx ends while appends run returns ctx's error and the
// rows it deleted (a prefix of the topic), and no chunk rides an append
// once ctx ended.
func TestPruneTopicRideCancelled(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	for i := range 1000 {
		mustAppend(t, s, "bulk", i)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s.testHookPruneChunk = func(int64, int) { cancel() } // after the first chunk
	stop := make(chan struct{})
	appended := appendLoop(t, s, "p", stop)
	n, err := s.PruneTopic(ctx, "bulk", math.MaxInt64)
	close(stop)
	appended()
	if !errors.Is(err, context.Canceled) || n <= 0 || n >= 1000 {
		t.Fatalf("PruneTopic cancelled after its first chunk = %d, %v; want some rows and context.Canceled", n, err)
	}
	s.writeMu.Lock()
	left := len(s.prunes)
	s.writeMu.Unlock()
	if left != 0 {
		t.Fatalf("%d prunes still in progress after PruneTopic returned", left)
	}
	if got := countTopic(t, s, "bulk"); got != 1000-n {
		t.Fatalf("%d rows of the topic left, want %d", got, 1000-n)
	}
}
