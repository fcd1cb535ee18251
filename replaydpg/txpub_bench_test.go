package replaydpg

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/event"
)

// BenchmarkPublishTxPaired: what publishing one event adds to an
// application's transaction, against what a plain insert of the same row
// into an application table adds. Each iteration runs three transactions
// on the application's own pool, in turn: the application's row alone
// (base), with a plain insert of the event's row (event id, type, topic,
// payload) into a table of the outbox's shape (plain), and with PublishTx
// (publish). It reports each one's time, the added costs (plain-base,
// publish-base) and their ratio; the target is ratio <= 1.5. The relays
// wait until the end (the benchmark holds the relay's advisory lock), so
// that only the application's transactions are measured: a relay
// committing meanwhile shares the WAL flushes of the next transactions,
// base or not, and made the pairs meaningless (plain-added came out
// negative). What the relay costs shows in BenchmarkPublishTxLatency.
//
//	REPLAYD_PG_FSYNC=1 source .ci/pg.sh && cd replaydpg
//	go test -run '^$' -bench PublishTxPaired -benchtime 2000x -count 3
func BenchmarkPublishTxPaired(b *testing.B) {
	s, prefix := openTestStore(b)
	ctx := context.Background()
	pool := testPool(b)
	orders := appTable(b, pool, prefix)
	plainTable := prefix + "raw" // dropped by testPrefix's cleanup
	if _, err := pool.Exec(ctx, `CREATE TABLE `+plainTable+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NOT NULL, type text NOT NULL, topic text, payload text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	payload := json.RawMessage(`{"order":42,"status":"shipped","carrier":"ups","eta":"2026-12-03"}`)
	var order int64
	run := func(extra func(tx pgx.Tx) error) time.Duration {
		order++
		t0 := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id, status) VALUES ($1, 'shipped')`, order); err != nil {
				return err
			}
			if extra == nil {
				return nil
			}
			return extra(tx)
		})
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	plain := func(tx pgx.Tx) error {
		ev, err := event.Prepare("orders", payload, event.Options{Type: event.DefaultType})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+plainTable+` (event_id, type, topic, payload) VALUES ($1, $2, $3, $4)`,
			ev.EventID, ev.Type, ev.Topic, string(ev.Payload))
		return err
	}
	publish := func(tx pgx.Tx) error {
		_, err := s.PublishTx(ctx, tx, "orders", payload)
		return err
	}
	for range 50 { // warm up: connections, prepared statements
		run(nil)
		run(plain)
		run(publish)
	}
	// Every relay waits for this session's advisory lock: only what the
	// application's transactions do is measured. Released at the end, the
	// outbox drains.
	lock, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer lock.Release()
	key := "replayd relay " + prefix
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
		b.Fatal(err)
	}
	defer lock.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key)
	var base, withPlain, withPublish []time.Duration
	b.ResetTimer()
	for range b.N {
		base = append(base, run(nil))
		withPlain = append(withPlain, run(plain))
		withPublish = append(withPublish, run(publish))
	}
	b.StopTimer()
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds()) / 1e3
	}
	mb, mp, mt := med(base), med(withPlain), med(withPublish)
	b.ReportMetric(mb, "base-µs")
	b.ReportMetric(mp, "plain-µs")
	b.ReportMetric(mt, "publish-µs")
	b.ReportMetric(mp-mb, "plain-added-µs")
	b.ReportMetric(mt-mb, "publish-added-µs")
	b.ReportMetric((mt-mb)/(mp-mb), "ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPublishTxLatency: commit-to-delivery on another node. Node A's
// application commits a transaction with an event 100 times a second; an
// SSE client of node B (another store: its own pool, listener and relay;
// StartTail with a 1 s fallback poll) timestamps each frame. Each latency
// runs from the start of the commit on A to the frame read on B: the
// commit, the NOTIFY that wakes the relays, the relay's transaction, the
// NOTIFY that wakes B's tail, B's read and the SSE write. It reports p50,
// p99 and max in milliseconds; every event must arrive once and in
// order. Compare BenchmarkCrossNodeLatency (the same for Publish on A).
//
//	REPLAYD_PG_FSYNC=1 source .ci/pg.sh && cd replaydpg
//	go test -run '^$' -bench 'PublishTxLatency|CrossNodeLatency' -benchtime 1000x -count 3
func BenchmarkPublishTxLatency(b *testing.B) {
	n := max(b.N, 100)
	dsn, prefix := testDSN(b), testPrefix(b)
	ctx := testCtx(b, time.Minute+time.Duration(n)*20*time.Millisecond)
	a := openPrefixDSN(b, prefix, dsn)
	hubB, err := replayd.NewWithStore(openPrefixDSN(b, prefix, dsn), replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	if err != nil {
		b.Fatal(err)
	}
	defer hubB.Close()
	stop, err := hubB.StartTail(time.Second, replayd.TailOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	pool := testPoolDSN(b, dsn)
	srv := httptest.NewServer(hubB.Handler())
	defer func() { srv.CloseClientConnections(); srv.Close() }()
	frames := sseFrames(b, ctx, srv.URL, "")
	if f := <-frames; f.event != "hello" {
		b.Fatalf("first frame %+v", f)
	}
	type arrival struct {
		at time.Time
		f  sseFrame
	}
	arrivals := make(chan arrival, n)
	go func() {
		for f := range frames {
			arrivals <- arrival{at: time.Now(), f: f}
		}
		close(arrivals)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	commits := make([]time.Time, n)
	b.ResetTimer()
	for i := range n {
		<-tick.C
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.PublishTx(ctx, tx, "", map[string]int{"i": i}); err != nil {
			b.Fatal(err)
		}
		commits[i] = time.Now()
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var lat []time.Duration
	last := -1
	timeout := time.After(10 * time.Second)
	for len(lat) < n {
		select {
		case ar, ok := <-arrivals:
			if !ok {
				b.Fatalf("stream ended after %d events", len(lat))
			}
			var p struct{ I int }
			if _, err := strconv.ParseInt(ar.f.id, 10, 64); err != nil || json.Unmarshal([]byte(ar.f.data), &p) != nil {
				b.Fatalf("bad frame %+v", ar.f)
			}
			if p.I != last+1 {
				b.Fatalf("event %d after %d", p.I, last)
			}
			last = p.I
			lat = append(lat, ar.at.Sub(commits[p.I]))
		case <-timeout:
			b.Fatalf("node B's client got %d of %d events within 10s", len(lat), n)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(p float64) float64 { return float64(quantile(lat, p).Microseconds()) / 1e3 }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(ms(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPublishTxConcurrent: 64 goroutines each committing application
// transactions (the application's row and one more insert) as fast as
// they can, for b.N transactions in all: with a plain insert of the
// event's row (plain) or with PublishTx (publish), the relays running.
// Every transaction that notifies takes PostgreSQL's notification lock
// from its pre-commit to the end of its commit, so such commits are
// serialised database-wide, where plain ones share WAL flushes: this
// measures what that costs. It reports transactions per second.
//
//	REPLAYD_PG_FSYNC=1 source .ci/pg.sh && cd replaydpg
//	go test -run '^$' -bench PublishTxConcurrent -benchtime 5000x -count 3
func BenchmarkPublishTxConcurrent(b *testing.B) {
	for _, publish := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "publish"}[publish], func(b *testing.B) {
			s, prefix := openTestStore(b)
			ctx := context.Background()
			pool := testPoolDSN(b, withPoolSize(testDSN(b), benchPublishers))
			orders := appTable(b, pool, prefix)
			plainTable := prefix + "raw"
			if _, err := pool.Exec(ctx, `CREATE TABLE `+plainTable+` (
				id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NOT NULL, type text NOT NULL, topic text, payload text NOT NULL)`); err != nil {
				b.Fatal(err)
			}
			payload := json.RawMessage(`{"order":42,"status":"shipped","carrier":"ups","eta":"2026-12-03"}`)
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			parallel(b, b.N, func(int) error {
				order := next.Add(1)
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id, status) VALUES ($1, 'shipped')`, order); err != nil {
						return err
					}
					if publish {
						_, err := s.PublishTx(ctx, tx, "orders", payload)
						return err
					}
					ev, err := event.Prepare("orders", payload, event.Options{Type: event.DefaultType})
					if err != nil {
						return err
					}
					_, err = tx.Exec(ctx, `INSERT INTO `+plainTable+` (event_id, type, topic, payload) VALUES ($1, $2, $3, $4)`,
						ev.EventID, ev.Type, ev.Topic, string(ev.Payload))
					return err
				})
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tx/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
