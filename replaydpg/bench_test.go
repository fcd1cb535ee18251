package replaydpg

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// The benchmarks compare Append, and the hub publishing through it, with
// raw ceilings on the same server: a single-row autocommit insert into a
// table of the same shape (identity column, unique event id, (topic,
// sequence) index), one at a time, from 64 goroutines, and 1,000 rows per
// statement. The machine they were written on is shared, so the Paired*
// ones interleave their contenders in short rounds and report ratios.
// Measure with fsync on (BENCHMARKS.md has the figures; the journal of
// each round is in git, git show 60f0bd1:BENCHMARKS.md):
//
//	REPLAYD_PG_FSYNC=1 source .ci/pg.sh
//	cd replaydpg
//	go test -run '^$' -bench 'PairedHub$' -benchtime 10x -count 3
//	go test -run '^$' -bench PairedSerial -benchtime 2000x -count 3
//	go test -run '^$' -bench CrossNodeLatency -benchtime 1000x -count 3
//	go test -run '^$' -bench Handshake1M -benchtime 1s -v
//	go test -run '^$' -bench ReadPages -benchtime 20x -count 3

const benchPublishers = 64

// rawTable creates a raw table of the log's shape and returns its name.
func rawTable(b *testing.B, pool *pgxpool.Pool, prefix string) string {
	b.Helper()
	name := prefix + "raw"
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+name+` (
		sequence   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		event_id   text NOT NULL UNIQUE,
		type       text NOT NULL,
		topic      text,
		payload    text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	if err == nil {
		_, err = pool.Exec(context.Background(), `CREATE INDEX ON `+name+` (topic, sequence)`)
	}
	if err != nil {
		b.Fatal(err)
	}
	return name
}

func reportRate(b *testing.B, start time.Time, events int) {
	b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
}

var benchRun atomic.Int64 // keeps event ids unique across b.N rounds

func benchID(i int) string { return fmt.Sprintf("b%d-%d", benchRun.Load(), i) }

// BenchmarkAppendSerial: one event per Append, one after another.
func BenchmarkAppendSerial(b *testing.B) { benchAppendSerial(b, false) }

// BenchmarkAppendSerialNoNotify: the same without the NOTIFY, to price it.
func BenchmarkAppendSerialNoNotify(b *testing.B) { benchAppendSerial(b, true) }

func benchAppendSerial(b *testing.B, noNotify bool) {
	s, _ := openTestStore(b)
	s.noNotify = noNotify
	benchRun.Add(1)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if _, err := s.Append(ctx, []replayd.Event{ev(benchID(i), "room", `{"n":1}`)}); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, start, b.N)
}

// BenchmarkRawInsertSerial: one autocommit single-row INSERT after another.
func BenchmarkRawInsertSerial(b *testing.B) {
	pool := testPool(b)
	table := rawTable(b, pool, testPrefix(b))
	benchRun.Add(1)
	ctx := context.Background()
	q := `INSERT INTO ` + table + ` (event_id, type, topic, payload) VALUES ($1, 'message', 'room', '{"n":1}')`
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if _, err := pool.Exec(ctx, q, benchID(i)); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, start, b.N)
}

// groupCommit is the simplest group-commit writer: publishers queue an
// event and wait; one goroutine appends whatever is queued (up to 1,000) in
// one Append, then answers them all. The hub's writer does the same.
type groupCommit struct {
	s       *Store
	reqs    chan groupReq
	done    chan struct{}
	batches atomic.Int64 // Appends made
}

type groupReq struct {
	ev    replayd.Event
	reply chan error
}

func startGroupCommit(s *Store) *groupCommit { return startGroupCommitN(s, 1) }

// startGroupCommitN runs writers such loops on one queue: with two, one
// batch waits on the head lock while the other commits, so the lock never
// idles for a client round trip.
func startGroupCommitN(s *Store, writers int) *groupCommit {
	g := &groupCommit{s: s, reqs: make(chan groupReq, 4096), done: make(chan struct{})}
	var wg sync.WaitGroup
	go func() {
		wg.Wait()
		close(g.done)
	}()
	wg.Add(writers)
	for range writers {
		go g.write(&wg)
	}
	return g
}

func (g *groupCommit) write(wg *sync.WaitGroup) {
	defer wg.Done()
	{
		for first := range g.reqs {
			batch := []groupReq{first}
		drain:
			for len(batch) < 1000 {
				select {
				case r, ok := <-g.reqs:
					if !ok {
						break drain
					}
					batch = append(batch, r)
				default:
					break drain
				}
			}
			evs := make([]replayd.Event, len(batch))
			for i, r := range batch {
				evs[i] = r.ev
			}
			g.batches.Add(1)
			res, err := g.s.Append(context.Background(), evs)
			for i, r := range batch {
				switch {
				case err != nil:
					r.reply <- err
				default:
					r.reply <- res[i].Err
				}
			}
		}
	}
}

func (g *groupCommit) publish(ev replayd.Event) error {
	reply := make(chan error, 1)
	g.reqs <- groupReq{ev, reply}
	return <-reply
}

func (g *groupCommit) stop() {
	close(g.reqs)
	<-g.done
}

// rawCeilings are the raw inserts the benchmarks compare with, into a
// table of the log's shape (rawTable) on a pool of benchPublishers.
type rawCeilings struct {
	pool  *pgxpool.Pool
	table string
}

// singles inserts n rows with single-row autocommit inserts from
// benchPublishers goroutines; id names row i.
func (r rawCeilings) singles(b *testing.B, n int, id func(i int) string) {
	q := `INSERT INTO ` + r.table + ` (event_id, type, topic, payload) VALUES ($1, 'message', 'room', '{"n":1}')`
	parallel(b, n, func(i int) error {
		_, err := r.pool.Exec(context.Background(), q, id(i))
		return err
	})
}

// batches inserts n rows (a multiple of 1,000) with 1,000-row statements.
func (r rawCeilings) batches(b *testing.B, n int, id func(i int) string) {
	q := `INSERT INTO ` + r.table + ` (event_id, type, topic, payload)
		SELECT id, 'message', 'room', '{"n":1}' FROM unnest($1::text[]) AS u(id)`
	for i := 0; i < n; i += 1000 {
		ids := make([]string, 1000)
		for j := range ids {
			ids[j] = id(i + j)
		}
		if _, err := r.pool.Exec(context.Background(), q, ids); err != nil {
			b.Fatal(err)
		}
	}
}

// parallel runs n operations spread over benchPublishers goroutines.
func parallel(b *testing.B, n int, op func(i int) error) {
	b.Helper()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range benchPublishers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkAppendGroupCommit64: 64 publishers through one group-commit writer.
func BenchmarkAppendGroupCommit64(b *testing.B) { benchGroupCommit(b, false) }

// BenchmarkAppendGroupCommit64NoNotify: the same without the NOTIFY.
func BenchmarkAppendGroupCommit64NoNotify(b *testing.B) { benchGroupCommit(b, true) }

func benchGroupCommit(b *testing.B, noNotify bool) {
	s, _ := openTestStore(b)
	s.noNotify = noNotify
	g := startGroupCommit(s)
	defer g.stop()
	benchRun.Add(1)
	b.ResetTimer()
	start := time.Now()
	parallel(b, b.N, func(i int) error { return g.publish(ev(benchID(i), "room", `{"n":1}`)) })
	reportRate(b, start, b.N)
}

// BenchmarkRawInsert64: 64 goroutines, each a single-row autocommit INSERT.
func BenchmarkRawInsert64(b *testing.B) {
	pool := testPoolDSN(b, withPoolSize(testDSN(b), benchPublishers))
	table := rawTable(b, pool, testPrefix(b))
	benchRun.Add(1)
	q := `INSERT INTO ` + table + ` (event_id, type, topic, payload) VALUES ($1, 'message', 'room', '{"n":1}')`
	b.ResetTimer()
	start := time.Now()
	parallel(b, b.N, func(i int) error {
		_, err := pool.Exec(context.Background(), q, benchID(i))
		return err
	})
	reportRate(b, start, b.N)
}

// BenchmarkRawBatch1000: 1,000 rows per autocommit INSERT ... SELECT unnest,
// one statement after another. b.N counts rows.
func BenchmarkRawBatch1000(b *testing.B) {
	pool := testPool(b)
	table := rawTable(b, pool, testPrefix(b))
	benchRun.Add(1)
	q := `INSERT INTO ` + table + ` (event_id, type, topic, payload)
		SELECT id, 'message', 'room', '{"n":1}' FROM unnest($1::text[]) AS u(id)`
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i += 1000 {
		ids := make([]string, 0, 1000)
		for j := i; j < min(i+1000, b.N); j++ {
			ids = append(ids, benchID(j))
		}
		if _, err := pool.Exec(context.Background(), q, ids); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, start, b.N)
}

// BenchmarkAppendBatch1000: Append with 1,000 events per call. b.N counts
// events.
func BenchmarkAppendBatch1000(b *testing.B) {
	s, _ := openTestStore(b)
	benchRun.Add(1)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i += 1000 {
		evs := make([]replayd.Event, 0, 1000)
		for j := i; j < min(i+1000, b.N); j++ {
			evs = append(evs, ev(benchID(j), "room", `{"n":1}`))
		}
		if _, err := s.Append(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, start, b.N)
}

// The machine these run on is shared, and fsync latency swings by 10× from
// one second to the next. The paired benchmarks interleave the contenders
// in short rounds so each ratio compares like with like.

// BenchmarkPairedSerial alternates one Append and one raw insert, b.N times
// each, and reports each one's rate and Append's share of the raw rate.
func BenchmarkPairedSerial(b *testing.B) {
	s, prefix := openTestStore(b)
	pool := testPool(b)
	table := rawTable(b, pool, prefix)
	benchRun.Add(1)
	ctx := context.Background()
	q := `INSERT INTO ` + table + ` (event_id, type, topic, payload) VALUES ($1, 'message', 'room', '{"n":1}')`
	var tAppend, tRaw time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if _, err := s.Append(ctx, []replayd.Event{ev(benchID(i), "room", `{"n":1}`)}); err != nil {
			b.Fatal(err)
		}
		tAppend += time.Since(start)
		start = time.Now()
		if _, err := pool.Exec(ctx, q, benchID(i)); err != nil {
			b.Fatal(err)
		}
		tRaw += time.Since(start)
	}
	b.ReportMetric(float64(b.N)/tAppend.Seconds(), "append/s")
	b.ReportMetric(float64(b.N)/tRaw.Seconds(), "raw/s")
	b.ReportMetric(tRaw.Seconds()/tAppend.Seconds(), "append/raw")
}

// BenchmarkPaired64 runs rounds of 2,000 events each way: 64 publishers
// through a group-commit writer, 64 raw single-row inserts, and raw
// 1,000-row statements, and reports each one's rate over all rounds and
// the group commit's ratio to the other two. b.N counts rounds.
func BenchmarkPaired64(b *testing.B) { benchPaired64(b, 1) }

// BenchmarkPaired64TwoWriters is BenchmarkPaired64 with two group-commit
// writers on one queue.
func BenchmarkPaired64TwoWriters(b *testing.B) { benchPaired64(b, 2) }

func benchPaired64(b *testing.B, writers int) {
	s, prefix := openTestStore(b)
	pool := testPoolDSN(b, withPoolSize(testDSN(b), benchPublishers))
	table := rawTable(b, pool, prefix)
	g := startGroupCommitN(s, writers)
	defer g.stop()
	const round = 2000
	raw := rawCeilings{pool, table}
	var tGroup, tRaw, tBatch time.Duration
	b.ResetTimer()
	for r := range b.N {
		id := func(kind string, i int) string { return fmt.Sprintf("%s%d-%d", kind, r, i) }
		start := time.Now()
		parallel(b, round, func(i int) error { return g.publish(ev(id("g", i), "room", `{"n":1}`)) })
		tGroup += time.Since(start)
		start = time.Now()
		raw.singles(b, round, func(i int) string { return id("r", i) })
		tRaw += time.Since(start)
		start = time.Now()
		raw.batches(b, round, func(i int) string { return id("b", i) })
		tBatch += time.Since(start)
	}
	n := float64(b.N * round)
	b.ReportMetric(n/tGroup.Seconds(), "group/s")
	b.ReportMetric(n/tRaw.Seconds(), "raw64/s")
	b.ReportMetric(n/tBatch.Seconds(), "batch1000/s")
	b.ReportMetric(tRaw.Seconds()/tGroup.Seconds(), "group/raw64")
	b.ReportMetric(tBatch.Seconds()/tGroup.Seconds(), "group/batch1000")
	b.ReportMetric(n/float64(g.batches.Load()), "events/append")
}

// countingStore is a Store that counts the hub's Appends: how many (and
// how many failed), how many events, and the time spent inside them (one
// at a time: the hub has one writer); and the stream transactions that
// committed (job streams' cost: TestJobsCost).
type countingStore struct {
	*Store
	appends, events, busy atomic.Int64
	appendErrs, updates   atomic.Int64
}

// commits counts the transactions that committed: Appends and
// UpdateStreams.
func (c *countingStore) commits() int64 {
	return c.appends.Load() + c.updates.Load() - c.appendErrs.Load()
}

func (c *countingStore) UpdateStreams(ctx context.Context, topics []string, fn func(storage.StreamTx) error) error {
	err := c.Store.UpdateStreams(ctx, topics, fn)
	if err == nil {
		c.updates.Add(1)
	}
	return err
}

func (c *countingStore) Append(ctx context.Context, evs []replayd.Event) ([]AppendResult, error) {
	start := time.Now()
	res, err := c.Store.Append(ctx, evs)
	c.busy.Add(int64(time.Since(start)))
	c.appends.Add(1)
	if err != nil {
		c.appendErrs.Add(1)
	}
	c.events.Add(int64(len(evs)))
	return res, err
}

// benchNode is a hub on its own store (its own pool and listener), as
// another machine's would be, tailing the log so that it sees the other
// nodes' rows as a deployed node does.
func benchNode(b *testing.B, prefix string) (*replayd.EventHub, *countingStore) {
	b.Helper()
	h, cs := benchHub(b, prefix)
	stop, err := h.StartTail(time.Second, replayd.TailOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	return h, cs
}

// benchHub is a hub on its own store that does not tail: a lone node.
func benchHub(b *testing.B, prefix string) (*replayd.EventHub, *countingStore) {
	b.Helper()
	cs := &countingStore{Store: openPrefix(b, prefix)}
	h, err := replayd.NewWithStore(cs, replayd.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	return h, cs
}

// publishOn runs n publishes spread over benchPublishers goroutines, each
// goroutine on one of hubs (round robin).
func publishOn(b *testing.B, n int, hubs ...*replayd.EventHub) {
	b.Helper()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	payload := json.RawMessage(`{"n":1}`)
	for g := range benchPublishers {
		h := hubs[g%len(hubs)]
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := h.Publish(context.Background(), "room", payload); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkPairedHub runs rounds of 2,000 events each way, interleaved so
// that every ratio compares contenders measured at the same moment on this
// shared machine: 64 goroutines publishing through one hub
// (replayd.NewWithStore, the hub's own group-commit writer; the hub tails,
// as a node of a cluster does); the same 64 goroutines spread over two
// hubs on two stores of one log (2 nodes x 32 publishers; both nodes in
// this process, each with its own pool and listener, both tailing); 64 raw
// single-row autocommit inserts; raw 1,000-row inserts; and, to tell the
// statement's cost from the batch size's, the store's Append with 1,000
// events per call. b.N counts rounds. It reports each rate, the ratios
// issue 11's targets name, the events per Append the hubs' writers
// achieved, and the share of the run, and the mean time, the one-node
// writer spent inside Append.
func BenchmarkPairedHub(b *testing.B) {
	one, cs1 := benchNode(b, testPrefix(b))
	prefix2 := testPrefix(b)
	twoA, csA := benchNode(b, prefix2)
	twoB, csB := benchNode(b, prefix2)
	pool := testPoolDSN(b, withPoolSize(testDSN(b), benchPublishers))
	table := rawTable(b, pool, prefix2)
	const round = 2000
	raw := rawCeilings{pool, table}
	store := openPrefix(b, testPrefix(b))
	var tOne, tTwo, tRaw, tBatch, tAppend time.Duration
	b.ResetTimer()
	for r := range b.N {
		id := func(kind string, i int) string { return fmt.Sprintf("%s%d-%d", kind, r, i) }
		start := time.Now()
		publishOn(b, round, one)
		tOne += time.Since(start)
		start = time.Now()
		publishOn(b, round, twoA, twoB)
		tTwo += time.Since(start)
		start = time.Now()
		raw.singles(b, round, func(i int) string { return id("r", i) })
		tRaw += time.Since(start)
		start = time.Now()
		raw.batches(b, round, func(i int) string { return id("b", i) })
		tBatch += time.Since(start)
		start = time.Now()
		for i := 0; i < round; i += 1000 {
			evs := make([]replayd.Event, 1000)
			for j := range evs {
				evs[j] = ev(id("a", i+j), "room", `{"n":1}`)
			}
			if _, err := store.Append(context.Background(), evs); err != nil {
				b.Fatal(err)
			}
		}
		tAppend += time.Since(start)
	}
	n := float64(b.N * round)
	b.ReportMetric(tBatch.Seconds()/tAppend.Seconds(), "append1000/batch1000")
	b.ReportMetric(n/tOne.Seconds(), "hub64/s")
	b.ReportMetric(n/tTwo.Seconds(), "2x32/s")
	b.ReportMetric(n/tRaw.Seconds(), "raw64/s")
	b.ReportMetric(n/tBatch.Seconds(), "batch1000/s")
	b.ReportMetric(tRaw.Seconds()/tOne.Seconds(), "hub64/raw64")
	b.ReportMetric(tBatch.Seconds()/tOne.Seconds(), "hub64/batch1000")
	b.ReportMetric(tOne.Seconds()/tTwo.Seconds(), "2x32/hub64")
	b.ReportMetric(float64(cs1.events.Load())/float64(cs1.appends.Load()), "events/append")
	b.ReportMetric(float64(csA.events.Load()+csB.events.Load())/float64(csA.appends.Load()+csB.appends.Load()), "2x32:events/append")
	b.ReportMetric(time.Duration(cs1.busy.Load()).Seconds()/tOne.Seconds(), "append-busy")
	b.ReportMetric(float64(cs1.busy.Load())/float64(cs1.appends.Load())/1e3, "µs/append")
}

// BenchmarkHubPublish64: 64 goroutines publishing through one hub, nothing
// else (for profiles). b.N counts events.
func BenchmarkHubPublish64(b *testing.B) {
	h, cs := benchNode(b, testPrefix(b))
	b.ResetTimer()
	start := time.Now()
	publishOn(b, b.N, h)
	reportRate(b, start, b.N)
	b.ReportMetric(float64(cs.events.Load())/float64(cs.appends.Load()), "events/append")
	b.ReportMetric(float64(cs.busy.Load())/float64(cs.appends.Load())/1e3, "µs/append")
}

// BenchmarkPairedAppendPaths compares, in interleaved rounds of 2,000
// events, 64 publishers on a hub whose store takes the usual path
// (qAppendNew: every event taken for new, one row back) with a hub whose
// store looks every event id up (qAppendDedup, the path a batch holding a
// stored id takes, and the only one before). b.N counts rounds.
func BenchmarkPairedAppendPaths(b *testing.B) {
	fast, csFast := benchNode(b, testPrefix(b))
	dedup, csDedup := benchNode(b, testPrefix(b))
	csDedup.dedupAlways = true
	const round = 2000
	var tFast, tDedup time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		publishOn(b, round, fast)
		tFast += time.Since(start)
		start = time.Now()
		publishOn(b, round, dedup)
		tDedup += time.Since(start)
	}
	n := float64(b.N * round)
	b.ReportMetric(n/tFast.Seconds(), "new/s")
	b.ReportMetric(n/tDedup.Seconds(), "dedup/s")
	b.ReportMetric(tDedup.Seconds()/tFast.Seconds(), "new/dedup")
	b.ReportMetric(float64(csFast.busy.Load())/float64(csFast.appends.Load())/1e3, "new:µs/append")
	b.ReportMetric(float64(csDedup.busy.Load())/float64(csDedup.appends.Load())/1e3, "dedup:µs/append")
	b.ReportMetric(float64(csFast.events.Load())/float64(csFast.appends.Load()), "new:events/append")
	b.ReportMetric(float64(csDedup.events.Load())/float64(csDedup.appends.Load()), "dedup:events/append")
}

// Handshakes on a million-row log (target: the same bound as SQLite's,
// git show 60f0bd1:BENCHMARKS.md, "Handshake from cursor 0 against near the head": from
// cursor 0 within 2x of near the head).
const (
	handshakeRows   = 1_000_000
	handshakeTopics = 100
)

// handshakeFixture fills a fresh log with handshakeRows rows shaped like
// the SQLite benchmarks' fixture (100 topics, every 101st row a broadcast,
// payloads the size of the root package's benchPayload), in one
// INSERT ... SELECT FROM generate_series with the ordinals Append would
// have given them, then VACUUM ANALYZE, as autovacuum would do on a log
// that size. It logs the time taken.
func handshakeFixture(b *testing.B) *Store {
	b.Helper()
	s, prefix := openTestStore(b)
	ctx := context.Background()
	start := time.Now()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	for _, q := range []string{
		`SET synchronous_commit = off`,
		render(`INSERT INTO %[1]sevents (sequence, event_id, type, topic, payload, created_at, topic_ord, global_ord)
			SELECT x, lpad(to_hex(x), 16, '0') || '-0000-7000-8000-bench', 'message', topic,
				'{"n":' || x || ',"pad":"' || repeat('x', 150) || '"}',
				'2026-01-01'::timestamptz + x * interval '1 millisecond',
				row_number() OVER (PARTITION BY topic ORDER BY x), x
			FROM (SELECT x, CASE WHEN x % 101 = 0 THEN NULL ELSE 'topic-' || lpad((x % $2)::text, 2, '0') END AS topic
				FROM generate_series(1, $1::bigint) AS x) r
			ORDER BY x`, prefix),
		render(`UPDATE %[1]shead SET seq = $1::bigint, ord = $1::bigint, created_at = '2026-01-01'::timestamptz + $1::bigint * interval '1 millisecond'`, prefix),
		`RESET synchronous_commit`,
		render(`VACUUM ANALYZE %[1]sevents`, prefix),
	} {
		var args []any
		switch {
		case strings.Contains(q, "$2"):
			args = []any{int64(handshakeRows), handshakeTopics}
		case strings.Contains(q, "$1"):
			args = []any{int64(handshakeRows)}
		}
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("fixture: %d rows over %d topics, built in %v", handshakeRows, handshakeTopics, time.Since(start).Round(time.Millisecond))
	return s
}

// BenchmarkHandshake1M times the store's Window (head, watermark, where
// the replay window of 100 starts and the skipped count, in one snapshot
// and one round trip: what the hub reads before a replay) on a million rows,
// in the global scope and a random topic's, as BenchmarkHandshake does for
// SQLite. Each iteration reads once from cursor 0 and once from ~20,000
// below the head, so the ratio compares reads made at the same moment;
// b.N counts pairs.
func BenchmarkHandshake1M(b *testing.B) {
	s := handshakeFixture(b)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, read := range []string{"Window"} {
		for _, scope := range []string{"global", "topic"} {
			b.Run(read+"/"+scope, func(b *testing.B) {
				var took [2]time.Duration
				for b.Loop() {
					for i, near := range []bool{false, true} {
						var topics []string
						if scope == "topic" {
							topics = []string{fmt.Sprintf("topic-%02d", rng.IntN(handshakeTopics))}
						}
						cursor := int64(0)
						if near {
							cursor = handshakeRows - 20_000 - rng.Int64N(1000)
						}
						start := time.Now()
						var skipped int64
						w, err := s.Window(ctx, topics, cursor, 100)
						if err != nil {
							b.Fatal(err)
						}
						skipped = w.Skipped.Count
						took[i] += time.Since(start)
						if skipped == 0 {
							b.Fatal("nothing skipped: the cursor is too near the head")
						}
					}
				}
				b.ReportMetric(float64(b.N)/took[0].Seconds(), "cursor0/s")
				b.ReportMetric(float64(b.N)/took[1].Seconds(), "nearHead/s")
				b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "cursor0/nearHead")
			})
		}
	}
}

// BenchmarkReadPages pages through a log as the hub replays (Read, 64
// events or 64 KiB a page), through a proxy that counts what the server
// sends: 200 events of 256 KiB (one a page) and 4,000 of about 100 bytes
// (64 a page), in the global scope and a topic's (a third of the events,
// and the broadcasts, another third). One op is one pass over the scope.
func BenchmarkReadPages(b *testing.B) {
	dsn, received := countingProxy(b, testDSN(b))
	for _, f := range []struct {
		name    string
		n, size int
	}{{"256KiB", 200, 256 << 10}, {"100B", 4000, 100}} {
		s := openPrefixDSN(b, testPrefix(b), dsn)
		for i := 0; i < f.n; {
			var batch []replayd.Event
			for ; i < f.n && len(batch) < max(10, 1000*100/f.size); i++ {
				batch = append(batch, ev(fmt.Sprintf("page-%d", i), []string{"a", "b", ""}[i%3], hexPayload(b, f.size)))
			}
			mustAppend(b, s, batch...)
		}
		for _, scope := range [][]string{nil, {"a"}} {
			name := f.name + "/global"
			if scope != nil {
				name = f.name + "/topic"
			}
			b.Run(name, func(b *testing.B) {
				var wire, payload int64
				for b.Loop() {
					before := received.Load()
					for after := int64(0); ; {
						p, err := s.Read(context.Background(), storage.ReadRequest{Scope: scope, After: after, Limit: 64, MaxBytes: 64 << 10})
						if err != nil {
							b.Fatal(err)
						}
						for _, e := range p.Events {
							payload += int64(len(e.Payload))
						}
						if !p.More {
							break
						}
						after = p.Events[len(p.Events)-1].Sequence
					}
					wire += received.Load() - before
				}
				b.ReportMetric(float64(wire)/float64(b.N)/(1<<20), "MiB-received/op")
				b.ReportMetric(float64(wire)/float64(payload), "received/payload")
			})
		}
	}
}

// BenchmarkForeignLookup measures what the sequence floor adds to every
// snapshot read (Window, Read): the skipped-range probe
// folded into the statement that reads the head. It times a poll's Read
// (10 events of a topic, one round trip) with the store's statement and
// with the same statement without the probe, in alternation in one loop
// (medians of the rounds, so that a busy machine's preemptions do not
// swamp the difference), on a log opened 1,000 times.
func BenchmarkForeignLookup(b *testing.B) {
	s, prefix := openTestStore(b)
	ctx := context.Background()
	pool := testPool(b)
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`skips (after, through)
		SELECT h.seq + (i - 1) * 1000, h.seq + i * 1000 FROM `+prefix+`head h, generate_series(1, 1000) i`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+prefix+`head SET seq = seq + 1000 * 1000`); err != nil {
		b.Fatal(err)
	}
	appendN(b, s, 1000, []string{"a", "b"}, "f")
	head, err := s.Head(ctx)
	if err != nil {
		b.Fatal(err)
	}
	cursor := head - 20
	withProbe := s.q.headForeign
	noProbe := render(`SELECT h.seq, $1::bigint > h.seq FROM %[1]shead h WHERE h.id = 1`, prefix)
	read := func(q string) time.Duration {
		s.q.headForeign = q
		start := time.Now()
		p, err := s.Read(ctx, storage.ReadRequest{Scope: []string{"a"}, After: cursor, Limit: 10})
		if err != nil || len(p.Events) != 10 || p.Foreign {
			b.Fatalf("read: %d events, foreign %v, %v", len(p.Events), p.Foreign, err)
		}
		return time.Since(start)
	}
	var tWith, tWithout, tDiff []float64
	for b.Loop() {
		without, with := read(noProbe), read(withProbe)
		tWith, tWithout = append(tWith, float64(with)), append(tWithout, float64(without))
		tDiff = append(tDiff, float64(with-without))
	}
	s.q.headForeign = withProbe
	median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	b.ReportMetric(median(tWithout), "read-ns")
	b.ReportMetric(median(tWith), "read+probe-ns")
	b.ReportMetric(median(tDiff), "probe-ns")
}
