package sqlitestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/storage"
)

// appendLoop appends one row of topic at a time, one every every (0:
// back to back), until stop is closed, and returns how many it appended
// once it stopped.
func appendLoop(t *testing.T, s *Store, topic string, every time.Duration, stop <-chan struct{}) func() int64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var tick <-chan time.Time
		if every > 0 {
			tk := time.NewTicker(every)
			defer tk.Stop()
			tick = tk.C
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			if tick != nil {
				select {
				case <-stop:
					return
				case <-tick:
				}
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

// fill appends n rows of topic "bulk" in batches of 500.
func fill(t *testing.T, s *Store, n int) {
	t.Helper()
	batch := make([]storage.Event, 500)
	for i := 0; i < n; i += len(batch) {
		for j := range batch {
			batch[j] = storage.Event{EventID: fmt.Sprintf("bulk-%d", i+j), Type: "m", Topic: "bulk", Payload: json.RawMessage(`{}`)}
		}
		if _, err := s.Append(t.Context(), batch); err != nil {
			t.Fatal(err)
		}
	}
}

// batches records the size of each batch of a prune of s, and when it
// committed.
func batches(s *Store) func() ([]int64, []time.Time) {
	var mu sync.Mutex
	var sizes []int64
	var at []time.Time
	var last int64
	s.testHookPruneChunk = func(deleted int64) {
		mu.Lock()
		sizes, at = append(sizes, deleted-last), append(at, time.Now())
		last = deleted
		mu.Unlock()
	}
	return func() ([]int64, []time.Time) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sizes), slices.Clone(at)
	}
}

// While this process appends (here a row a millisecond), a per-topic
// prune deletes exactly the topic's rows, none of the appends', every
// append succeeds, and it makes room for them: batches of gapRows,
// paused between (at least prunepace's 2 ms each). On a quiet log it
// deletes topicPruneBatch at a time.
func TestPruneTopicWhileAppending(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	const bulk = 3000
	fill(t, s, bulk)
	sizes := batches(s)
	stop := make(chan struct{})
	appended := appendLoop(t, s, "p", time.Millisecond, stop)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n, err := s.PruneTopic(ctx, "bulk", math.MaxInt64)
	close(stop)
	kept := appended()
	if err != nil || n != bulk {
		t.Fatalf("PruneTopic = %d, %v; want %d", n, err, bulk)
	}
	if got := countTopic(t, s, "bulk"); got != 0 {
		t.Errorf("%d rows of the pruned topic left", got)
	}
	if got := countTopic(t, s, "p"); got != kept {
		t.Errorf("%d rows of the appended topic, want %d", got, kept)
	}
	got, at := sizes()
	for i, b := range got {
		if b > gapRows {
			t.Fatalf("batch %d of %v deleted %d rows while appends came; want at most %d", i, got, b, gapRows)
		}
		if i > 0 && at[i].Sub(at[i-1]) < 2*time.Millisecond {
			t.Fatalf("batch %d committed %v after the one before: not paced (want at least 2 ms)", i, at[i].Sub(at[i-1]))
		}
	}

	fill(t, s, bulk)
	time.Sleep(quietAfter) // the log turns quiet
	sizes = batches(s)
	if n, err := s.PruneTopic(t.Context(), "bulk", math.MaxInt64); err != nil || n != bulk {
		t.Fatalf("PruneTopic on a quiet log = %d, %v; want %d", n, err, bulk)
	}
	if got, _ := sizes(); got[0] != topicPruneBatch {
		t.Errorf("quiet log: batches %v; want %d rows each", got, topicPruneBatch)
	}
}

// A prune that never finds room (an append always waiting, here
// pretended) still runs a batch after each maxYield, and ends.
func TestPruneTopicWithoutRoom(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	fill(t, s, 500)
	s.writers.Add(1)
	defer s.writers.Add(-1)
	start := time.Now()
	n, err := s.PruneTopic(t.Context(), "bulk", math.MaxInt64)
	if err != nil || n != 500 {
		t.Fatalf("PruneTopic = %d, %v; want 500", n, err)
	}
	if took := time.Since(start); took < maxYield {
		t.Errorf("took %v: it did not wait for room (maxYield %v)", took, maxYield)
	}
}

// A prune whose ctx ends while appends run returns ctx's error and the
// rows it deleted (a prefix of the topic), exactly those.
func TestPruneTopicCancelled(t *testing.T) {
	db, _ := openTestDB(t)
	s := openTestStore(t, db)
	for i := range 1000 {
		mustAppend(t, s, "bulk", i)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s.testHookPruneChunk = func(int64) { cancel() } // after the first batch
	stop := make(chan struct{})
	appended := appendLoop(t, s, "p", 0, stop)
	n, err := s.PruneTopic(ctx, "bulk", math.MaxInt64)
	close(stop)
	appended()
	if !errors.Is(err, context.Canceled) || n <= 0 || n >= 1000 {
		t.Fatalf("PruneTopic cancelled after its first batch = %d, %v; want some rows and context.Canceled", n, err)
	}
	if got := countTopic(t, s, "bulk"); got != 1000-n {
		t.Fatalf("%d rows of the topic left, want %d", got, 1000-n)
	}
}
