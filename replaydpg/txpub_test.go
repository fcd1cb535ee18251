package replaydpg

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx" driver
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/childproc"
	"github.com/replayd/replayd/internal/nodetest"
	"github.com/replayd/replayd/storage"
)

// appTable creates the application's own table prefix+"orders" and drops
// it when the test ends.
func appTable(t testing.TB, pool *pgxpool.Pool, prefix string) string {
	t.Helper()
	table := prefix + "orders"
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (id bigint PRIMARY KEY, status text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return table
}

// tailingHub is a hub on s tailing the log (an hour's fallback poll: only
// NOTIFY wakes it), served over SSE by an httptest server.
func tailingHub(t testing.TB, s *Store) (*replayd.EventHub, string) {
	t.Helper()
	h, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := h.StartTail(time.Hour, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		stop()
		h.Close()
	})
	return h, srv.URL
}

// sseFrames connects to an SSE endpoint (Last-Event-ID lastID, if not
// empty) and returns its frames; the stream ends with the test.
func sseFrames(t testing.TB, ctx context.Context, url, lastID string) <-chan sseFrame {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	out := make(chan sseFrame, 256)
	go func() {
		defer resp.Body.Close()
		readSSE(resp.Body, out)
	}()
	return out
}

// framesUntil reads frames (after the hello) until one carries the event
// id want in its data's "id" field, and returns the message frames read;
// it fails on any other frame type, a gap first of all.
func framesUntil(t testing.TB, frames <-chan sseFrame, want string, within time.Duration) []sseFrame {
	t.Helper()
	var got []sseFrame
	deadline := time.After(within)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				t.Fatalf("stream ended after %v, before %s", got, want)
			}
			switch f.event {
			case "hello":
				continue
			case "message":
			default:
				t.Fatalf("a %q frame (%s) before %s; messages so far %v", f.event, f.data, want, got)
			}
			got = append(got, f)
			var p struct{ ID string }
			if json.Unmarshal([]byte(f.data), &p) == nil && p.ID == want {
				return got
			}
		case <-deadline:
			t.Fatalf("%s not delivered within %v; got %v", want, within, got)
		}
	}
}

// TestPublishTxTwoNodes: an event published in the application's
// transaction is delivered, once, to SSE clients of two hubs on two
// stores (two nodes) after the commit, with no further call; a rolled
// back one leaves no row, no delivery and no gap frame.
func TestPublishTxTwoNodes(t *testing.T) {
	t.Parallel()
	a, prefix := openTestStore(t)
	b := openPrefix(t, prefix)
	ctx := testCtx(t, time.Minute)
	pool := testPool(t)
	orders := appTable(t, pool, prefix)
	_, urlA := tailingHub(t, a)
	_, urlB := tailingHub(t, b)
	clients := []<-chan sseFrame{sseFrames(t, ctx, urlA, ""), sseFrames(t, ctx, urlB, "")}
	for _, c := range clients { // the hello: the stream is live
		if f := <-c; f.event != "hello" {
			t.Fatalf("first frame %+v", f)
		}
	}

	ship := func(id int64, commit bool, publish func(tx pgx.Tx) (replayd.Event, error)) replayd.Event {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id, status) VALUES ($1, 'shipped')`, id); err != nil {
			t.Fatal(err)
		}
		ev, err := publish(tx)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return ev
	}
	payload := func(id int64) map[string]any {
		return map[string]any{"id": fmt.Sprint("order-", id), "status": "shipped"}
	}
	ev42 := ship(42, true, func(tx pgx.Tx) (replayd.Event, error) { return a.PublishTx(ctx, tx, "orders", payload(42)) })
	if ev42.Sequence != 0 || ev42.EventID == "" || ev42.Type != "message" || ev42.Topic != "orders" || string(ev42.Payload) != `{"id":"order-42","status":"shipped"}` {
		t.Fatalf("PublishTx returned %+v", ev42)
	}
	ship(43, false, func(tx pgx.Tx) (replayd.Event, error) {
		return b.PublishTx(ctx, tx, "orders", payload(43), replayd.WithType("shipped"))
	})
	ship(44, true, func(tx pgx.Tx) (replayd.Event, error) { return b.PublishTx(ctx, tx, "", payload(44)) })
	for i, c := range clients {
		got := framesUntil(t, c, "order-44", 10*time.Second)
		if len(got) != 2 || got[0].data != `{"id":"order-42","status":"shipped"}` {
			t.Fatalf("client of node %d got %v, want order-42 then order-44", i, got)
		}
	}
	// The log: 42 and 44, once each; the outbox empty; 43 nowhere.
	var rows []string
	for _, e := range allEvents(t, a) {
		rows = append(rows, string(e.Payload))
	}
	if fmt.Sprint(rows) != fmt.Sprint([]string{`{"id":"order-42","status":"shipped"}`, `{"id":"order-44","status":"shipped"}`}) {
		t.Fatalf("log %v", rows)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("outbox holds %d rows (%v)", n, err)
	}
	// Nothing more arrives: not 43, not a gap.
	for i, c := range clients {
		select {
		case f := <-c:
			t.Fatalf("client of node %d: a further frame %+v", i, f)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// TestPublishTxRetries: idempotency by event id across PublishTx,
// PublishSQLTx and the hub's Publish, whichever stores first, including a
// Publish that stores the id while the outbox still holds it.
func TestPublishTxRetries(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	ctx := testCtx(t, time.Minute)
	pool := testPool(t)
	h, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	db, err := sql.Open("pgx", testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	inTx := func(publish func(tx pgx.Tx) (replayd.Event, error)) replayd.Event {
		t.Helper()
		var ev replayd.Event
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			ev, err = publish(tx)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	inSQLTx := func(commit bool, opts ...replayd.PublishOption) replayd.Event {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := s.PublishSQLTx(ctx, tx, "t", map[string]int{"n": 1}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	// stored waits until the log holds event id and returns it.
	stored := func(id string) replayd.Event {
		t.Helper()
		for {
			head, err := s.Head(ctx) // before the look-up: a relay after it wakes the wait
			if err != nil {
				t.Fatal(err)
			}
			var seq int64
			err = pool.QueryRow(ctx, `SELECT sequence FROM `+prefix+`events WHERE event_id = $1`, id).Scan(&seq)
			if err == nil {
				return readSeq(t, s, seq)
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
			if err := s.WaitForAppend(ctx, head); err != nil {
				t.Fatalf("%s never reached the log: %v", id, err)
			}
		}
	}
	count := func(id string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`events WHERE event_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// PublishTx first; then Publish, PublishTx and PublishSQLTx retries.
	inTx(func(tx pgx.Tx) (replayd.Event, error) {
		return s.PublishTx(ctx, tx, "t", map[string]int{"n": 1}, replayd.WithEventID("r1"))
	})
	orig := stored("r1")
	if ev, err := h.Publish(ctx, "t", map[string]int{"n": 2}, replayd.WithEventID("r1")); err != nil || ev.Sequence != orig.Sequence || string(ev.Payload) != `{"n":1}` {
		t.Fatalf("Publish retry: %+v, %v; want the original %+v", ev, err, orig)
	}
	if ev := inTx(func(tx pgx.Tx) (replayd.Event, error) {
		return s.PublishTx(ctx, tx, "t", map[string]int{"n": 3}, replayd.WithEventID("r1"))
	}); ev.Sequence != orig.Sequence || string(ev.Payload) != `{"n":1}` || !ev.CreatedAt.Equal(orig.CreatedAt) {
		t.Fatalf("PublishTx retry returned %+v, want the original %+v", ev, orig)
	}
	if ev := inSQLTx(true, replayd.WithEventID("r1")); ev.Sequence != orig.Sequence {
		t.Fatalf("PublishSQLTx retry returned %+v, want the original %+v", ev, orig)
	}

	// Publish first; then PublishTx returns it and stores nothing.
	first, err := h.Publish(ctx, "t", 5, replayd.WithEventID("r2"))
	if err != nil {
		t.Fatal(err)
	}
	if ev := inTx(func(tx pgx.Tx) (replayd.Event, error) { return s.PublishTx(ctx, tx, "t", 6, replayd.WithEventID("r2")) }); ev.Sequence != first.Sequence {
		t.Fatalf("PublishTx after Publish: %+v, want %+v", ev, first)
	}

	// While the outbox holds r3 (every relay held off by the relay's
	// advisory lock), Publish stores it; the relay then stores nothing.
	lock, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, "replayd relay "+prefix); err != nil {
		t.Fatal(err)
	}
	inTx(func(tx pgx.Tx) (replayd.Event, error) { return s.PublishTx(ctx, tx, "t", 7, replayd.WithEventID("r3")) })
	inTx(func(tx pgx.Tx) (replayd.Event, error) { return s.PublishTx(ctx, tx, "t", 7, replayd.WithEventID("r3")) }) // twice in the outbox
	inSQLTx(true, replayd.WithEventID("r4"))
	inSQLTx(false, replayd.WithEventID("r5")) // rolled back
	pub, err := h.Publish(ctx, "t", 7, replayd.WithEventID("r3"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, "replayd relay "+prefix); err != nil {
		t.Fatal(err)
	}
	if ev := stored("r4"); ev.Sequence <= pub.Sequence {
		t.Fatalf("r4 at %d, below Publish's r3 at %d", ev.Sequence, pub.Sequence)
	}
	waitOutboxEmpty(t, ctx, pool, prefix)
	if ev := stored("r3"); ev.Sequence != pub.Sequence {
		t.Fatalf("r3 at %d, Publish returned %d", ev.Sequence, pub.Sequence)
	}
	for _, id := range []string{"r1", "r2", "r3", "r4"} {
		if n := count(id); n != 1 {
			t.Fatalf("%d rows of %s", n, id)
		}
	}
	if n := count("r5"); n != 0 {
		t.Fatalf("the rolled back r5 is in the log")
	}

	// Bad input is Publish's ErrInvalid, and the transaction goes on.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, bad := range []func() error{
			func() error { _, err := s.PublishTx(ctx, tx, " t", 1); return err },
			func() error { _, err := s.PublishTx(ctx, tx, "t", json.RawMessage(`{`)); return err },
			func() error { _, err := s.PublishTx(ctx, tx, "t", 1, replayd.WithEventID("a\nb")); return err },
			func() error { _, err := s.PublishTx(ctx, tx, "t", json.RawMessage("\"\xff\"")); return err },
		} {
			if err := bad(); !errors.Is(err, replayd.ErrInvalid) {
				t.Errorf("bad input: %v, want ErrInvalid", err)
			}
		}
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	if err != nil {
		t.Fatalf("the transaction after refused input: %v", err)
	}
}

// readSeq reads the event at seq.
func readSeq(t testing.TB, s *Store, seq int64) replayd.Event {
	t.Helper()
	pg, err := s.Read(context.Background(), storage.ReadRequest{After: seq - 1, Through: seq, Limit: 1})
	if err != nil || len(pg.Events) != 1 || pg.Events[0].Sequence != seq {
		t.Fatalf("read %d: %v, %v", seq, pg.Events, err)
	}
	return pg.Events[0]
}

// waitOutboxEmpty waits, within ctx, until the outbox of prefix is empty.
func waitOutboxEmpty(t testing.TB, ctx context.Context, pool *pgxpool.Pool, prefix string) {
	t.Helper()
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`outbox`).Scan(&n); err != nil {
			t.Fatalf("the outbox: %v", err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the outbox still holds %d rows", n)
		case <-time.After(10 * time.Millisecond): // no signal for "relayed": poll
		}
	}
}

// TestPublishTxLongOpen: an application transaction that published and
// stays open for 5 s holds up no publisher: 64 goroutines appending one
// event at a time go on at about the same rate and p99 as without it
// (logged; asserted only within generous bounds, the machine is shared),
// and the event, relayed after the commit, gets a sequence above every
// one appended meanwhile (no sequence was held for it).
func TestPublishTxLongOpen(t *testing.T) {
	s, prefix := openTestStore(t)
	ctx := testCtx(t, 2*time.Minute)
	pool := testPool(t)
	orders := appTable(t, pool, prefix)
	const writers = 64
	phase := func(d time.Duration, during func()) (rate float64, p99 time.Duration, top int64) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		lats := make([][]time.Duration, writers)
		tops := make([]int64, writers)
		errs := make(chan error, writers)
		start := time.Now()
		for w := range writers {
			go func() {
				for i := 0; pctx.Err() == nil; i++ {
					t0 := time.Now()
					res, err := s.Append(ctx, []replayd.Event{ev(fmt.Sprintf("w%d-%d-%d", w, i, t0.UnixNano()), "load", `{}`)})
					if err != nil {
						errs <- err
						return
					}
					lats[w] = append(lats[w], time.Since(t0))
					tops[w] = max(tops[w], res[0].Event.Sequence)
				}
				errs <- nil
			}()
		}
		if during != nil {
			during()
		}
		for range writers {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		var all []time.Duration
		for w := range writers {
			all = append(all, lats[w]...)
			top = max(top, tops[w])
		}
		slices.Sort(all)
		return float64(len(all)) / elapsed.Seconds(), all[len(all)*99/100], top
	}
	rateA, p99A, _ := phase(2*time.Second, nil)

	// For comparison: an application transaction that stays open as long
	// without publishing. Any transaction holding an xid for seconds
	// slows a hot row's updates down (PostgreSQL cannot prune the head
	// row's dead versions meanwhile), whatever replayd does.
	plain, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Exec(ctx, `INSERT INTO `+orders+` (id, status) VALUES (41, 'shipped')`); err != nil {
		t.Fatal(err)
	}
	ratePlain, p99Plain, _ := phase(5*time.Second, nil)
	if err := plain.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id, status) VALUES (42, 'shipped')`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PublishTx(ctx, tx, "orders", map[string]int{"order": 42}, replayd.WithEventID("long")); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	rateB, p99B, top := phase(5*time.Second, nil)
	held := time.Since(opened)
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	if err := s.WaitForAppend(ctx, head); err != nil {
		t.Fatal(err)
	}
	var seq int64
	if err := pool.QueryRow(ctx, `SELECT sequence FROM `+prefix+`events WHERE event_id = 'long'`).Scan(&seq); err != nil {
		t.Fatalf("the event after the commit: %v", err)
	}
	if seq <= top {
		t.Fatalf("the event got sequence %d, below %d appended while its transaction was open", seq, top)
	}
	t.Logf("64 appenders: %.0f events/s, p99 %v with no open transaction; %.0f events/s, p99 %v with one open 5 s that did not publish; %.0f events/s, p99 %v with one open %v that published (PublishTx); its event in the log %v after the commit",
		rateA, p99A.Round(time.Microsecond), ratePlain, p99Plain.Round(time.Microsecond), rateB, p99B.Round(time.Microsecond), held.Round(time.Millisecond), time.Since(committed).Round(time.Microsecond))
	// Holding the head lock would have stopped every appender for 5 s.
	if rateB < rateA/4 || p99B > 2*time.Second {
		t.Fatalf("the open transaction held up the appenders: %.0f events/s and p99 %v, against %.0f and %v", rateB, p99B, rateA, p99A)
	}
}

const (
	txKillDSNEnv    = "REPLAYD_PG_TXKILL_DSN"    // run as TestPublishTxKilled's child on this DSN
	txKillPrefixEnv = "REPLAYD_PG_TXKILL_PREFIX" // its table prefix
	txKillModeEnv   = "REPLAYD_PG_TXKILL_MODE"   // "commit" or "serve"
)

// TestPublishTxKilled: a process commits its transaction with an event
// and is killed with SIGKILL before any relay moved it (every relay is
// held off by the relay's advisory lock, which the test holds); a node
// started afterwards relays it, and its SSE client gets it exactly once.
func TestPublishTxKilled(t *testing.T) {
	if dsn := os.Getenv(txKillDSNEnv); dsn != "" {
		txKillChild(dsn, os.Getenv(txKillPrefixEnv), os.Getenv(txKillModeEnv))
		os.Exit(0)
	}
	t.Parallel()
	dsn, prefix := testDSN(t), testPrefix(t)
	ctx := testCtx(t, time.Minute)
	s := openPrefix(t, prefix) // the schema; its relay is stopped at once
	s.Close()
	pool := testPool(t)
	orders := appTable(t, pool, prefix)
	head0, err := openPrefix(t, prefix).Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	key := "replayd relay " + prefix
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
		t.Fatal(err)
	}
	// Held by this test, the lock also holds up the relay of the store
	// opened for head0, until it is released.

	child := func(mode string, out func(line string)) *childproc.Proc {
		return childproc.Start(t, "TestPublishTxKilled", func(stdout io.Reader) {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				out(sc.Text())
			}
		}, txKillDSNEnv+"="+dsn, txKillPrefixEnv+"="+prefix, txKillModeEnv+"="+mode)
	}
	committed := make(chan string, 1)
	p := child("commit", func(line string) { committed <- line })
	select {
	case line := <-committed:
		if line != "committed" {
			t.Fatalf("child: %q; stderr %s", line, p.Stderr())
		}
	case <-ctx.Done():
		t.Fatalf("the child did not commit: %s", p.Stderr())
	}
	p.Kill()
	p.Wait()
	count := func(q string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`SELECT count(*) FROM ` + orders); n != 1 {
		t.Fatalf("%d application rows after the commit", n)
	}
	if n, m := count(`SELECT count(*) FROM `+prefix+`outbox`), count(`SELECT count(*) FROM `+prefix+`events`); n != 1 || m != 0 {
		t.Fatalf("after the kill: %d rows in the outbox, %d in the log; want 1 and 0 (not relayed yet)", n, m)
	}

	// The restart: another process, a node serving SSE.
	addr := make(chan string, 1)
	child("serve", func(line string) {
		if a, ok := strings.CutPrefix(line, "addr "); ok {
			addr <- a
		}
	})
	var url string
	select {
	case url = <-addr:
	case <-ctx.Done():
		t.Fatal("the restarted node did not start")
	}
	frames := sseFrames(t, ctx, url, strconv.FormatInt(head0, 10))
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key); err != nil {
		t.Fatal(err)
	}
	if got := framesUntil(t, frames, "killed-1", 20*time.Second); len(got) != 1 {
		t.Fatalf("frames %v, want the event once", got)
	}
	waitOutboxEmpty(t, ctx, pool, prefix)
	if n := count(`SELECT count(*) FROM ` + prefix + `events WHERE event_id = 'killed-1'`); n != 1 {
		t.Fatalf("%d rows of the event", n)
	}
	select {
	case f := <-frames:
		t.Fatalf("a further frame %+v", f)
	case <-time.After(300 * time.Millisecond):
	}
}

// txKillChild is TestPublishTxKilled's child: "commit" opens a store,
// ships order 7 with its event in one transaction, commits, says
// "committed" and waits to be killed; "serve" is a node serving SSE.
func txKillChild(dsn, prefix, mode string) {
	die := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	s, err := Open(ctx, dsn, WithTablePrefix(prefix))
	if err != nil {
		die(err)
	}
	if mode == "serve" {
		hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
		if err != nil {
			die(err)
		}
		if _, err := hub.StartTail(time.Hour, replayd.TailOptions{}); err != nil {
			die(err)
		}
		if _, err := nodetest.Serve(hub); err != nil {
			die(err)
		}
		io.Copy(io.Discard, os.Stdin)
		return
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		die(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+prefix+`orders (id, status) VALUES (7, 'shipped')`); err != nil {
			return err
		}
		_, err := s.PublishTx(ctx, tx, "orders", map[string]string{"id": "killed-1"}, replayd.WithEventID("killed-1"))
		return err
	})
	if err != nil {
		die(err)
	}
	fmt.Println("committed")
	io.Copy(io.Discard, os.Stdin)
}
