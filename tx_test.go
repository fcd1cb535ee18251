package replayd

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/childproc"
	"github.com/replayd/replayd/internal/wiretest"
)

// Publishing inside the application's own transaction on SQLite (tx.go).

// ordersTable creates the application's own table in db.
func ordersTable(t testing.TB, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// shipInTx marks order id shipped and publishes it, in one InTx.
func shipInTx(ctx context.Context, h *EventHub, id int, opts ...PublishOption) (Event, error) {
	var ev Event
	err := h.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (?, 'shipped')
			ON CONFLICT (id) DO UPDATE SET status = 'shipped'`, id); err != nil {
			return err
		}
		var err error
		ev, err = h.PublishTx(ctx, tx, "orders", map[string]any{"id": id, "status": "shipped"}, opts...)
		return err
	})
	return ev, err
}

func countRows(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInTxCommitDelivers(t *testing.T) {
	db, _ := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	c := wiretest.Dial(t, serve(t, h).URL+"?topic=orders", nil)
	c.Hello()

	ev, err := shipInTx(context.Background(), h, 42, WithEventID("order-42-shipped"))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Sequence == 0 || ev.EventID != "order-42-shipped" || ev.Type != "message" || ev.CreatedAt.IsZero() {
		t.Fatalf("returned event %+v", ev)
	}
	f := c.NextIs(ev.Sequence, "the committed event")
	if f.Data != `{"id":42,"status":"shipped"}` {
		t.Fatalf("data %q", f.Data)
	}
	c.Quiet(300 * time.Millisecond) // once
	if n := countRows(t, db, `SELECT count(*) FROM orders WHERE id = 42 AND status = 'shipped'`); n != 1 {
		t.Fatalf("orders rows: %d", n)
	}
	// A Publish after it goes on from its sequence, with no gap.
	next := mustPublish(t, h, "orders", 1)
	c.NextIs(next.Sequence, "the next publish")
	if next.Sequence <= ev.Sequence {
		t.Fatalf("next sequence %d not above %d", next.Sequence, ev.Sequence)
	}
}

// TestPublishTxOwnTxDelivers: a transaction the application begins and
// commits itself; the hub, not tailing, delivers the event after the commit
// with no further call.
func TestPublishTxOwnTxDelivers(t *testing.T) {
	db, path := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	c := wiretest.Dial(t, serve(t, h).URL+"?topic=orders", nil)
	c.Hello()
	// Another process's tailing hub gets it too.
	other := secondHub(t, path, Options{})
	if _, err := other.StartTail(5*time.Millisecond, TailOptions{}); err != nil {
		t.Fatal(err)
	}
	oc := wiretest.Dial(t, serve(t, other).URL+"?topic=orders", nil)
	oc.Hello()

	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (7, 'shipped')`); err != nil {
		t.Fatal(err)
	}
	ev, err := h.PublishTx(ctx, tx, "orders", map[string]any{"id": 7})
	if err != nil {
		t.Fatal(err)
	}
	// Not committed yet: nothing is delivered.
	c.Quiet(100 * time.Millisecond)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	c.NextIs(ev.Sequence, "the committed event")
	oc.NextIs(ev.Sequence, "the committed event, on the other hub")
	c.Quiet(200 * time.Millisecond)
	oc.Quiet(10 * time.Millisecond)
}

// setTxWatchFor sets the watch's window (txWatchFor) to d for the test:
// call it before making the test's hubs, so that it is restored after
// they close.
func setTxWatchFor(t *testing.T, d time.Duration) {
	t.Helper()
	old := txWatchFor
	txWatchFor = d
	t.Cleanup(func() { txWatchFor = old })
}

// txWatching reports whether h's commit watch runs.
func txWatching(h *EventHub) bool {
	h.txp.mu.Lock()
	defer h.txp.mu.Unlock()
	return h.txp.watching
}

// beginPublishTx begins a transaction on db, writes an order in it and
// publishes it there with PublishTx.
func beginPublishTx(t *testing.T, db *sql.DB, h *EventHub, id int) (*sql.Tx, Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (?, 'shipped')`, id); err != nil {
		t.Fatal(err)
	}
	ev, err := h.PublishTx(ctx, tx, "orders", map[string]any{"id": id})
	if err != nil {
		t.Fatal(err)
	}
	return tx, ev
}

// lateTxWindow is the watch's window in the late-transaction tests,
// shortened from 30 s (lateTxHub).
const lateTxWindow = 200 * time.Millisecond

// lateTxHub is a hub whose commit watch has a window of lateTxWindow, on a file
// with the orders table, and a live SSE client of topic orders past its
// hello.
func lateTxHub(t *testing.T) (*EventHub, *sql.DB, *wiretest.Client) {
	t.Helper()
	setTxWatchFor(t, lateTxWindow)
	db, _ := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	c := wiretest.Dial(t, serve(t, h).URL+"?topic=orders", nil)
	c.Hello()
	return h, db, c
}

// TestPublishTxLateCommit: a transaction the application commits itself
// long after its publish, past the watch's window (shortened here from
// 30 s), is still delivered to a live client soon after the commit, with
// no tail and no other publish; then the watch ends.
func TestPublishTxLateCommit(t *testing.T) {
	h, db, c := lateTxHub(t)

	tx, ev := beginPublishTx(t, db, h, 7)
	published := time.Now()
	c.Quiet(5 * lateTxWindow) // open past the window: nothing is delivered
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	f, err := c.NextErr(5 * time.Second)
	if err != nil {
		t.Fatalf("the event committed %v after its publish, within 5 s of the commit: %v",
			committed.Sub(published).Round(time.Millisecond), err)
	}
	if f.ID != fmt.Sprint(ev.Sequence) {
		t.Fatalf("frame %+v, want event %d", f, ev.Sequence)
	}
	t.Logf("committed %v after the publish, delivered %v after the commit",
		committed.Sub(published).Round(time.Millisecond), time.Since(committed).Round(time.Microsecond))
	c.Quiet(100 * time.Millisecond) // once
	wiretest.WaitUntil(t, "the watch to end", func() bool { return !txWatching(h) })
}

// TestPublishTxLateRollback: a transaction that published and stays open
// past the watch's window, then rolls back, delivers nothing, no gap
// either, and the watch ends within a window of the rollback: nothing
// reads the log once no transaction is left to watch. A publish after it
// follows with no gap.
func TestPublishTxLateRollback(t *testing.T) {
	h, db, c := lateTxHub(t)

	tx, _ := beginPublishTx(t, db, h, 7)
	c.Quiet(3 * lateTxWindow)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	wiretest.WaitUntil(t, "the watch to end", func() bool { return !txWatching(h) })
	c.Quiet(100 * time.Millisecond)
	ev := mustPublish(t, h, "orders", 3)
	c.NextIs(ev.Sequence, "the next publish")
}

// TestTxEnded pins what the watch relies on from database/sql (txEnded):
// an open transaction reads as open, also while another goroutine runs a
// statement in it, and one committed, rolled back, or ended by its
// context reads as ended.
func TestTxEnded(t *testing.T) {
	db, _ := openTestDB(t)
	ordersTable(t, db)
	begin := func(ctx context.Context, id int) *sql.Tx {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback() })
		if _, err := tx.Exec(`INSERT INTO orders (id, status) VALUES (?, 'shipped')`, id); err != nil {
			t.Fatal(err)
		}
		if txEnded(tx) {
			t.Fatal("an open transaction reads as ended")
		}
		return tx
	}
	tx := begin(context.Background(), 1)
	rows, err := tx.Query(`SELECT id FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	if txEnded(tx) {
		t.Fatal("an open transaction reads as ended while a query runs in it")
	}
	rows.Close()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if !txEnded(tx) {
		t.Fatal("a committed transaction reads as open")
	}
	tx = begin(context.Background(), 2)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if !txEnded(tx) {
		t.Fatal("a rolled-back transaction reads as open")
	}
	ctx, cancel := context.WithCancel(context.Background())
	tx = begin(ctx, 3)
	cancel() // database/sql rolls it back
	wiretest.WaitUntil(t, "the cancelled transaction to read as ended", func() bool { return txEnded(tx) })
}

// TestPublishTxOpenAtClose: Close ends the watch of a transaction still
// open.
func TestPublishTxOpenAtClose(t *testing.T) {
	db, _ := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	tx, _ := beginPublishTx(t, db, h, 7)
	if !txWatching(h) {
		t.Fatal("no watch after PublishTx")
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if txWatching(h) {
		t.Fatal("the watch runs after Close")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestInTxRollback(t *testing.T) {
	db, _ := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	var gaps []Gap
	var gmu sync.Mutex
	unsub := h.SubscribeWithGaps(func(Event) {}, func(g Gap) { gmu.Lock(); gaps = append(gaps, g); gmu.Unlock() })
	defer unsub()
	c := wiretest.Dial(t, serve(t, h).URL+"?topic=orders", nil)
	c.Hello()
	ctx := context.Background()
	head0, _ := h.LatestSequence(ctx)

	// fn fails: InTx rolls back and returns fn's error.
	boom := errors.New("boom")
	err := h.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (1, 'shipped')`); err != nil {
			return err
		}
		if _, err := h.PublishTx(ctx, tx, "orders", 1, WithEventID("rolled-back-1")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v, want boom", err)
	}
	// The application's own transaction, rolled back.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.PublishTx(ctx, tx, "orders", 2, WithEventID("rolled-back-2")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	if n := countRows(t, db, `SELECT count(*) FROM events WHERE event_id LIKE 'rolled-back-%'`); n != 0 {
		t.Fatalf("%d rolled-back events in the log", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders after rollbacks", n)
	}
	if head, _ := h.LatestSequence(ctx); head != head0 {
		t.Fatalf("head moved from %d to %d", head0, head)
	}
	c.Quiet(300 * time.Millisecond)
	// The next event follows with no gap frame before it.
	ev := mustPublish(t, h, "orders", 3)
	c.NextIs(ev.Sequence, "the next publish")
	gmu.Lock()
	defer gmu.Unlock()
	if len(gaps) != 0 {
		t.Fatalf("gaps after a rollback: %+v", gaps)
	}
}

// TestPublishTxIdempotent: an event id is stored once whichever path
// stored it first.
func TestPublishTxIdempotent(t *testing.T) {
	db, _ := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	ctx := context.Background()

	first := mustPublish(t, h, "orders", 1, WithEventID("a"))
	again, err := shipInTx(ctx, h, 1, WithEventID("a"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Sequence != first.Sequence || string(again.Payload) != "1" {
		t.Fatalf("PublishTx of a published id: %+v, want the original %+v", again, first)
	}

	inTx, err := shipInTx(ctx, h, 2, WithEventID("b"))
	if err != nil {
		t.Fatal(err)
	}
	retry, err := h.Publish(ctx, "orders", "other", WithEventID("b"))
	if err != nil {
		t.Fatal(err)
	}
	if retry.Sequence != inTx.Sequence || retry.EventID != "b" {
		t.Fatalf("Publish of a PublishTx'd id: %+v, want %+v", retry, inTx)
	}
	retryTx, err := shipInTx(ctx, h, 2, WithEventID("b"))
	if err != nil || retryTx.Sequence != inTx.Sequence {
		t.Fatalf("PublishTx retry: %+v, %v; want sequence %d", retryTx, err, inTx.Sequence)
	}
	for _, id := range []string{"a", "b"} {
		if n := countRows(t, db, `SELECT count(*) FROM events WHERE event_id = ?`, id); n != 1 {
			t.Fatalf("event %q stored %d times", id, n)
		}
	}
	// Bad input is refused before anything is written; the transaction goes on.
	err = h.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := h.PublishTx(ctx, tx, " bad", 1); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("bad topic: %v, want ErrInvalid", err)
		}
		_, err := h.PublishTx(ctx, tx, "orders", 3, WithEventID("c"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, `SELECT count(*) FROM events WHERE event_id = 'c'`); n != 1 {
		t.Fatalf("event c stored %d times", n)
	}
}

// TestInTxHeldOpen: a transaction held open while other goroutines
// Publish. SQLite's single writer serialises them: the publishes wait for
// the transaction's end, none is lost, and they are delivered in sequence
// order after the transaction's event.
func TestInTxHeldOpen(t *testing.T) {
	db, _ := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	var (
		mu  sync.Mutex
		got []int64
	)
	unsub := h.Subscribe(func(ev Event) { mu.Lock(); got = append(got, ev.Sequence); mu.Unlock() })
	defer unsub()
	ctx := context.Background()
	const publishers, hold = 16, 2 * time.Second

	inside := make(chan struct{})
	var txEv Event
	var released time.Time
	txDone := make(chan error, 1)
	go func() {
		txDone <- h.InTx(ctx, func(tx *sql.Tx) error {
			var err error
			if txEv, err = h.PublishTx(ctx, tx, "orders", "in tx"); err != nil {
				return err
			}
			close(inside)
			time.Sleep(hold) // the application's long transaction
			released = time.Now()
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-txDone:
		t.Fatal(err)
	}
	type res struct {
		ev  Event
		at  time.Time
		err error
	}
	results := make(chan res, publishers)
	for i := range publishers {
		go func() {
			ev, err := h.Publish(ctx, "orders", i)
			results <- res{ev, time.Now(), err}
		}()
	}
	select {
	case err := <-txDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hold + waitFor):
		t.Fatal("InTx did not return")
	}
	var pubs []int64
	for range publishers {
		r := <-results
		if r.err != nil {
			t.Fatalf("publish during the transaction: %v", r.err)
		}
		if r.at.Before(released) {
			t.Fatalf("a publish returned at %v, before the transaction ended at %v", r.at, released)
		}
		if r.ev.Sequence <= txEv.Sequence {
			t.Fatalf("publish got %d, not above the transaction's %d", r.ev.Sequence, txEv.Sequence)
		}
		pubs = append(pubs, r.ev.Sequence)
	}
	// Subscribe callbacks run before Publish returns: every event is
	// delivered by now, the transaction's first, then the publishes in
	// sequence order.
	slices.Sort(pubs)
	mu.Lock()
	defer mu.Unlock()
	if want := append([]int64{txEv.Sequence}, pubs...); !slices.Equal(got, want) {
		t.Fatalf("delivered %v; want %v", got, want)
	}
}

const txCrashChildEnv = "REPLAYD_TXCRASH_CHILD" // the database path: run as the child

// TestPublishTxCrashAfterCommit: a child OS process commits an event
// published in its own transaction and is killed with SIGKILL before it
// delivers anything. A hub already tailing the file delivers it once, and
// a hub opened afterwards serves it once by replay.
func TestPublishTxCrashAfterCommit(t *testing.T) {
	if path := os.Getenv(txCrashChildEnv); path != "" {
		txCrashChild(path)
		os.Exit(0)
	}
	db, path := openTestDB(t)
	ordersTable(t, db)
	tailing := newTestHub(t, db, Options{})
	if _, err := tailing.StartTail(10*time.Millisecond, TailOptions{}); err != nil {
		t.Fatal(err)
	}
	c := wiretest.Dial(t, serve(t, tailing).URL+"?topic=orders", nil)
	c.Hello()

	lines := make(chan string, 4)
	child := childproc.Start(t, "TestPublishTxCrashAfterCommit", func(stdout io.Reader) {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}, txCrashChildEnv+"="+path)
	var seq int64
	select {
	case line, ok := <-lines:
		if _, err := fmt.Sscanf(line, "committed %d", &seq); !ok || err != nil {
			t.Fatalf("child said %q (%v): %s", line, err, child.Stderr())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the child committed nothing: %s", child.Stderr())
	}
	child.Kill()
	if state := child.Wait(); state.Exited() {
		t.Fatalf("the child exited by itself (%v): %s", state, child.Stderr())
	}

	c.NextIs(seq, "the dead child's committed event, through the tail")
	c.Quiet(300 * time.Millisecond)

	later := secondHub(t, path, Options{})
	lc := wiretest.Dial(t, serve(t, later).URL+"?topic=orders", wiretest.LastID(seq-1))
	lc.Hello()
	lc.NextIs(seq, "the dead child's committed event, by replay")
	lc.Quiet(300 * time.Millisecond)
	if n := countRows(t, db, `SELECT count(*) FROM events WHERE event_id = 'crash-order'`); n != 1 {
		t.Fatalf("stored %d times", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM orders WHERE id = 9`); n != 1 {
		t.Fatalf("the order row: %d", n)
	}
}

// txCrashChild commits one event in its own transaction, says so, and
// waits to be killed.
func txCrashChild(path string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	db, err := OpenDB(path)
	if err != nil {
		fail(err)
	}
	h, err := New(db, Options{})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fail(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (9, 'shipped')`); err != nil {
		fail(err)
	}
	ev, err := h.PublishTx(ctx, tx, "orders", map[string]any{"id": 9}, WithEventID("crash-order"))
	if err != nil {
		fail(err)
	}
	if err := tx.Commit(); err != nil {
		fail(err)
	}
	fmt.Printf("committed %d\n", ev.Sequence)
	io.Copy(io.Discard, os.Stdin) // until killed
}

// TestInTxTakesWriteLock: InTx holds SQLite's write lock from its start,
// before the application writes anything, so a Publish waits for it.
func TestInTxTakesWriteLock(t *testing.T) {
	db, _ := openTestDB(t)
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	ctx := context.Background()
	inside, release := make(chan struct{}), make(chan struct{})
	txDone := make(chan error, 1)
	go func() {
		txDone <- h.InTx(ctx, func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
				return err
			}
			close(inside)
			<-release
			_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES (5, 'new')`)
			return err
		})
	}()
	<-inside
	pub := make(chan error, 1)
	go func() {
		_, err := h.Publish(ctx, "orders", 1)
		pub <- err
	}()
	select {
	case err := <-pub:
		t.Fatalf("Publish returned (%v) while InTx held the write lock", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	for _, c := range []chan error{txDone, pub} {
		select {
		case err := <-c:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(waitFor):
			t.Fatal("no answer")
		}
	}
}

// TestInTxMemory: ":memory:" has a pool of one connection, which the
// transaction holds; the writer and the delivery wait for it.
func TestInTxMemory(t *testing.T) {
	db, err := OpenDB(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ordersTable(t, db)
	h := newTestHub(t, db, Options{})
	got := make(chan Event, 4)
	defer h.Subscribe(func(ev Event) { got <- ev })()
	ctx := context.Background()
	ev, err := shipInTx(ctx, h, 1)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if d.Sequence != ev.Sequence {
			t.Fatalf("delivered %d, want %d", d.Sequence, ev.Sequence)
		}
	case <-time.After(waitFor):
		t.Fatal("not delivered")
	}
	next := mustPublish(t, h, "orders", 2)
	if d := <-got; d.Sequence != next.Sequence {
		t.Fatalf("delivered %d, want %d", d.Sequence, next.Sequence)
	}
}

// TestInTxUnsupportedStore: a store that cannot append in a transaction.
func TestInTxUnsupportedStore(t *testing.T) {
	db, _ := openTestDB(t)
	s, err := NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.(io.Closer).Close()
	h, err := NewWithStore(struct{ Store }{s}, Options{}) // only the contract
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx := context.Background()
	if err := h.InTx(ctx, func(*sql.Tx) error { return nil }); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("InTx: %v, want ErrUnsupported", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := h.PublishTx(ctx, tx, "a", 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("PublishTx: %v, want ErrUnsupported", err)
	}
}
