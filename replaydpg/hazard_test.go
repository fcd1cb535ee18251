package replaydpg

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd"
)

const appenders = 64

// hazardDuration is how long the concurrent writers run.
func hazardDuration() time.Duration {
	if testing.Short() {
		return time.Second
	}
	return 3 * time.Second
}

// tailReader reads "sequence > cursor" in a loop, advancing its cursor over
// what it saw, and records every sequence it saw, until written is closed
// (every writer has returned) and it has caught up with final().
type tailReader struct {
	seen map[int64]bool
	err  error
}

func runTailReader(ctx context.Context, written <-chan struct{}, read func(ctx context.Context, after int64) ([]int64, error), final func(ctx context.Context) (int64, error)) *tailReader {
	r := &tailReader{seen: map[int64]bool{}}
	var cursor int64
	stopped := false
	for {
		seqs, err := read(ctx, cursor)
		if err != nil {
			r.err = err
			return r
		}
		for _, s := range seqs {
			if s <= cursor {
				r.err = fmt.Errorf("read %d at cursor %d", s, cursor)
				return r
			}
			r.seen[s] = true
			cursor = s
		}
		if stopped && len(seqs) == 0 {
			head, err := final(ctx)
			if err != nil {
				r.err = err
				return r
			}
			if cursor >= head {
				return r
			}
		}
		select {
		case <-written:
			stopped = true
		default:
		}
	}
}

// TestNoSkippedRows is the ordering hazard (see replayd.Store) against this store: 64
// concurrent appenders on two stores (two nodes), and a reader reading
// "sequence > cursor" in a loop. Every committed row must have been seen:
// a row committed below a sequence the reader has already passed would be
// skipped forever. The appenders also share event ids across nodes and use
// a handful of topics, and afterwards every topic's ordinals must be
// contiguous, which they are only if duplicates are found and ordinals
// assigned under the same lock as sequences.
//
// It does not run in parallel with other tests: its 66 connections are most
// of a default max_connections.
func TestNoSkippedRows(t *testing.T) {
	prefix := testPrefix(t)
	dsn := withPoolSize(testDSN(t), appenders/2+2)
	a, b := openPrefixDSN(t, prefix, dsn), openPrefixDSN(t, prefix, dsn)
	ctx := testCtx(t, 2*time.Minute)
	base, err := a.Head(ctx) // the sequence floor: sequences go on from it
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		appended atomic.Int64
		dups     atomic.Int64
	)
	for i := range appenders {
		s := []*Store{a, b}[i%2]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				batch := make([]replayd.Event, 1+rng.IntN(3))
				for j := range batch {
					// A quarter of the ids are shared by every appender.
					id := fmt.Sprintf("w%d-%d-%d", i, n, j)
					if rng.IntN(4) == 0 {
						id = fmt.Sprintf("shared-%d", rng.IntN(2000))
					}
					batch[j] = ev(id, []string{"a", "b", "c", ""}[rng.IntN(4)], `{}`)
				}
				res, err := s.Append(ctx, batch)
				if err != nil {
					t.Error(err)
					return
				}
				for _, r := range res {
					if r.Duplicate {
						dups.Add(1)
					} else {
						appended.Add(1)
					}
				}
			}
		})
	}
	written := make(chan struct{}) // closed when every writer has returned
	readDone := make(chan *tailReader, 1)
	go func() {
		readDone <- runTailReader(ctx, written,
			func(ctx context.Context, after int64) ([]int64, error) {
				evs, err := readAfter(ctx, a, after, 1000)
				return sequences(evs), err
			}, a.Head)
	}()
	time.Sleep(hazardDuration())
	close(stop)
	wg.Wait()
	close(written)
	r := <-readDone
	if r.err != nil {
		t.Fatal(r.err)
	}
	all := allEvents(t, a)
	skipped := 0
	for _, e := range all {
		if !r.seen[e.Sequence] {
			skipped++
			if skipped < 20 {
				t.Logf("skipped %d (%s) created %v", e.Sequence, e.EventID, e.CreatedAt)
			}
		}
	}
	t.Logf("%d rows appended (%d duplicates refused) by %d appenders on 2 stores; reader saw %d; skipped %d",
		appended.Load(), dups.Load(), appenders, len(r.seen), skipped)
	if int64(len(all)) != appended.Load() {
		t.Errorf("%d rows stored, %d appends reported stored", len(all), appended.Load())
	}
	if skipped != 0 {
		t.Errorf("the reader skipped %d committed rows", skipped)
	}
	if len(all) > 0 && all[len(all)-1].Sequence != base+int64(len(all)) {
		t.Errorf("last sequence %d for %d rows above %d: a duplicate consumed a sequence", all[len(all)-1].Sequence, len(all), base)
	}
	checkOrdinals(t, testPool(t), prefix)
}

// checkOrdinals verifies that topic_ord numbers each topic's rows (and the
// broadcasts) and global_ord every row, without holes, in sequence order.
func checkOrdinals(t *testing.T, pool *pgxpool.Pool, prefix string) {
	t.Helper()
	var groups, topics, globalGroups int
	err := pool.QueryRow(context.Background(), `SELECT
		count(DISTINCT (coalesce(topic, ''), topic_ord - tr)), count(DISTINCT coalesce(topic, '')), count(DISTINCT global_ord - gr)
		FROM (SELECT topic, topic_ord, global_ord,
			row_number() OVER (PARTITION BY topic ORDER BY sequence) AS tr,
			row_number() OVER (ORDER BY sequence) AS gr
		FROM `+prefix+`events) x`).Scan(&groups, &topics, &globalGroups)
	if err != nil {
		t.Fatal(err)
	}
	if groups != topics || globalGroups > 1 {
		t.Errorf("ordinals have holes: %d runs of topic ordinals for %d topics, %d runs of global ordinals", groups, topics, globalGroups)
	}
}

// TestIdentityColumnSkipsRows is the control: the same reader against a
// plain identity column with 64 single-row autocommit writers. It reports
// how many rows the reader skipped; it asserts nothing, since how often the
// race is lost depends on the machine, but the count is the reason the
// store assigns sequences under a lock.
func TestIdentityColumnSkipsRows(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement, not a check")
	}
	prefix := testPrefix(t)
	pool := testPoolDSN(t, withPoolSize(testDSN(t), appenders+2))
	ctx := testCtx(t, 2*time.Minute)
	if _, err := pool.Exec(ctx, `CREATE TABLE `+prefix+`raw (
		sequence bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range appenders {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`raw (payload) VALUES ('{}')`); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	written := make(chan struct{}) // closed when every writer has returned
	readDone := make(chan *tailReader, 1)
	go func() {
		readDone <- runTailReader(ctx, written,
			func(ctx context.Context, after int64) ([]int64, error) {
				rows, err := pool.Query(ctx, `SELECT sequence FROM `+prefix+`raw WHERE sequence > $1 ORDER BY sequence LIMIT 1000`, after)
				if err != nil {
					return nil, err
				}
				var out []int64
				for rows.Next() {
					var s int64
					if err := rows.Scan(&s); err != nil {
						return nil, err
					}
					out = append(out, s)
				}
				return out, rows.Err()
			},
			func(ctx context.Context) (int64, error) {
				var head int64
				err := pool.QueryRow(ctx, `SELECT coalesce(max(sequence), 0) FROM `+prefix+`raw`).Scan(&head)
				return head, err
			})
	}()
	time.Sleep(hazardDuration())
	close(stop)
	wg.Wait()
	close(written)
	r := <-readDone
	if r.err != nil {
		t.Fatal(r.err)
	}
	var total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`raw`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	t.Logf("identity column, %d single-row writers: %d rows committed, reader skipped %d", appenders, total, total-len(r.seen))
}
