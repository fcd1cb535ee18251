package replayd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/sqlitetest"
	"github.com/replayd/replayd/internal/wiretest"
)

// holdWriteLock takes the write lock of the database at path on a
// connection of its own, as another process would, until release is
// called (idempotent; it also runs at cleanup).
func holdWriteLock(t testing.TB, path string) (release func()) {
	t.Helper()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	return sqlitetest.HoldWriteLock(t, db)
}

type publishResult struct {
	id  string
	ev  Event
	err error
}

// publishMany publishes n events with ids prefix-0… from n goroutines and
// returns the channel their results arrive on.
func publishMany(h *EventHub, prefix string, n int) <-chan publishResult {
	out := make(chan publishResult, n)
	for i := range n {
		go func() {
			id := fmt.Sprintf("%s-%d", prefix, i)
			ev, err := h.Publish(context.Background(), "a", i, WithEventID(id))
			out <- publishResult{id, ev, err}
		}()
	}
	return out
}

// checkOutcomes collects n results and checks each against the log: a
// success is stored, ErrClosed is not, ErrOutcomeUnknown may be either; any
// other error fails the test. It returns how many succeeded and how many
// were unknown.
func checkOutcomes(t *testing.T, db *sql.DB, results <-chan publishResult, n int) (ok, unknown int) {
	t.Helper()
	for range n {
		var r publishResult
		select {
		case r = <-results:
		case <-time.After(waitFor):
			t.Fatalf("a Publish did not return within %v of Close", waitFor)
		}
		var stored int
		if err := db.QueryRow(`SELECT count(*) FROM events WHERE event_id = ?`, r.id).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		switch {
		case r.err == nil && stored == 1 && r.ev.Sequence > 0:
			ok++
		case errors.Is(r.err, ErrOutcomeUnknown):
			unknown++
		case errors.Is(r.err, ErrClosed) && stored == 0:
		default:
			t.Fatalf("Publish of %s returned (%+v, %v) and the log holds it %d times", r.id, r.ev, r.err, stored)
		}
	}
	return ok, unknown
}

// lockChildEnv makes the test binary a child that holds a database's write
// lock until its stdin closes.
const lockChildEnv = "REPLAYD_LOCK_CHILD"

// lockChild takes the write lock of the database at path, prints "locked",
// and holds the lock until stdin closes or a minute has passed.
func lockChild(path string) {
	db, err := OpenDB(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if _, err := db.Exec("BEGIN IMMEDIATE"); err != nil { // the pool holds one connection open
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("locked")
	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-time.After(time.Minute):
	}
	os.Exit(0) // the lock goes with the process
}

// Close must return promptly whatever another process does: here it holds
// the write lock for longer than the busy timeout while the writer waits
// for it, as another connection of this process and as another process. No
// caller may be told of a success that was not committed.
func TestCloseBoundedUnderForeignWriteLock(t *testing.T) {
	if path := os.Getenv(lockChildEnv); path != "" {
		lockChild(path)
	}
	t.Run("connection", func(t *testing.T) {
		testCloseBoundedUnderLock(t, holdWriteLock)
	})
	t.Run("process", func(t *testing.T) {
		testCloseBoundedUnderLock(t, func(t testing.TB, path string) func() {
			child := crashStart(t.(*testing.T), "TestCloseBoundedUnderForeignWriteLock", lockChildEnv+"="+path)
			select {
			case line := <-child.lines:
				if line != "locked" {
					t.Fatalf("child: %q; %s", line, child.stderr())
				}
			case <-time.After(waitFor):
				t.Fatalf("the child did not take the lock: %s", child.stderr())
			}
			return func() {
				child.kill()
				child.wait()
			}
		})
	})
}

func testCloseBoundedUnderLock(t *testing.T, lock func(t testing.TB, path string) (release func())) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	mustPublish(t, h, "", "warm") // the writer's connection is open
	committing := make(chan struct{}, 1)
	h.testHookCommit = func() {
		select {
		case committing <- struct{}{}:
		default:
		}
	}
	release := lock(t, path)
	const n = 20
	results := publishMany(h, "held", n)
	select {
	case <-committing: // the writer now waits for the foreign lock
	case <-time.After(waitFor):
		t.Fatal("the writer never took a batch")
	}
	start := time.Now()
	err := h.Close()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took > 2*time.Second {
		t.Fatalf("Close took %v with another connection holding the write lock; want at most 2s", took)
	}
	release()
	ok, unknown := checkOutcomes(t, db, results, n)
	if ok > 0 {
		t.Fatalf("%d publishes succeeded although the lock was never free", ok)
	}
	t.Logf("Close took %v; %d refused with ErrClosed, %d unknown", took, n-ok-unknown, unknown)
}

// The lock is released at different moments after Close begins: within
// the grace Close gives a commit in flight, and after. Whatever the moment,
// a success is stored, ErrClosed is not, and a commit that could finish in
// the grace is reported as a success.
func TestCloseUnderForeignWriteLockReportsTruthfully(t *testing.T) {
	db, path := openTestDB(t)
	for round, delay := range []time.Duration{20 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, 3 * time.Second} {
		h, err := New(db, Options{})
		if err != nil {
			t.Fatal(err)
		}
		mustPublish(t, h, "", "warm")
		committing := make(chan struct{}, 1)
		h.testHookCommit = func() {
			select {
			case committing <- struct{}{}:
			default:
			}
		}
		release := holdWriteLock(t, path)
		const n = 10
		results := publishMany(h, fmt.Sprint("round", round), n)
		select {
		case <-committing:
		case <-time.After(waitFor):
			t.Fatal("the writer never took a batch")
		}
		timer := time.AfterFunc(delay, release)
		start := time.Now()
		if err := h.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		took := time.Since(start)
		timer.Stop()
		release() // now, if the timer has not run it yet
		if took > 2*time.Second {
			t.Fatalf("round %d: Close took %v", round, took)
		}
		ok, unknown := checkOutcomes(t, db, results, n)
		if round == 0 && ok == 0 {
			t.Fatalf("the lock was free %v after Close began, yet no publish in flight was committed", delay)
		}
		t.Logf("lock released %v after Close: Close took %v; %d stored, %d refused, %d unknown", delay, took.Round(time.Millisecond), ok, n-ok-unknown, unknown)
	}
}

// A Publish whose ctx ends while its event is being committed does not know
// whether it was stored: its error says so, and a retry with the same event
// id is safe.
func TestPublishCtxEndsMidCommitIsOutcomeUnknown(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	mustPublish(t, h, "", "warm")
	release := holdWriteLock(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := h.Publish(ctx, "a", 1, WithEventID("late"))
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish: %v; want ErrOutcomeUnknown and DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Publish returned %v after its ctx ended", took-200*time.Millisecond)
	}
	// A lone publish commits on its own goroutine and gives up with its
	// ctx, storing nothing; one handed to the writer would still be
	// committed. Either way the retry with the same id leaves one event.
	release()
	ev, err := h.Publish(context.Background(), "a", 2, WithEventID("late"))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	var n int
	var payload string
	if err := db.QueryRow(`SELECT count(*), max(payload) FROM events WHERE event_id = 'late'`).Scan(&n, &payload); err != nil {
		t.Fatal(err)
	}
	if n != 1 || payload != string(ev.Payload) {
		t.Fatalf("the log holds %d events with the id (payload %s); the retry returned %s", n, payload, ev.Payload)
	}
}

// stuckStore is a hub's store whose Append first waits for gate,
// deaf to its context, as a database call that cannot be cancelled would.
type stuckStore struct {
	Store
	gate chan struct{}
}

func (s *stuckStore) Append(ctx context.Context, evs []Event) ([]AppendResult, error) {
	<-s.gate
	return s.Store.Append(ctx, evs)
}

// Should the writer not stop even when its commit is cancelled, Close
// still returns in bounded time, with an error, and the publish it gave up
// on says that its outcome is unknown (not that nothing was stored).
func TestCloseAbandonsAWriterThatDoesNotStop(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	mustPublish(t, h, "", "warm")
	ss := &stuckStore{Store: h.store, gate: make(chan struct{})}
	h.store = ss    // read by the writer only after the next publish reaches it
	h.alone = false // a store deaf to its ctx is committed by the writer only
	committing := make(chan struct{}, 1)
	h.testHookCommit = func() { committing <- struct{}{} }
	res := make(chan error, 1)
	go func() {
		_, err := h.Publish(context.Background(), "a", 1, WithEventID("stuck"))
		res <- err
	}()
	<-committing
	start := time.Now()
	err := h.Close()
	took := time.Since(start)
	if err == nil || took > closeGrace+closeAbandon+time.Second {
		t.Fatalf("Close took %v and returned %v; want an error within about %v", took, err, closeGrace+closeAbandon)
	}
	select {
	case err := <-res:
		if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrClosed) {
			t.Fatalf("Publish: %v; want ErrOutcomeUnknown", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Publish did not return after Close gave up")
	}
	close(ss.gate) // the writer stops at last; nothing outlives the test
	h.wg.Wait()
	t.Logf("Close gave up after %v: %v", took, err)
}

// A publish whose ctx ends while its event still waits in the queue (the
// writer busy with an earlier batch) takes it back: its error is ctx's
// alone, not ErrOutcomeUnknown, and the event is never stored. Others
// queued with it are committed in the writer's next batch.
func TestPublishWithdrawnBeforeTheWriterTakesIt(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	h.alone = false // every publish goes through the writer's queue
	committing, gate := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	h.testHookCommit = func() {
		once.Do(func() {
			committing <- struct{}{}
			<-gate
		})
	}
	first := publishMany(h, "first", 1)
	select {
	case <-committing: // the writer holds the first batch
	case <-time.After(waitFor):
		t.Fatal("the writer never took a batch")
	}
	ctx, cancel := context.WithCancel(context.Background())
	late := make(chan error, 1)
	go func() {
		_, err := h.Publish(ctx, "a", 1, WithEventID("withdrawn"))
		late <- err
	}()
	kept := publishMany(h, "kept", 3)
	wiretest.WaitUntil(t, "the publishes to queue", func() bool { return h.queue.len() == 4 })
	cancel()
	select {
	case err := <-late:
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("Publish: %v; want context.Canceled, the outcome known", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the queued Publish did not return when its ctx ended")
	}
	close(gate)
	if ok, unknown := checkOutcomes(t, db, first, 1); ok != 1 || unknown != 0 {
		t.Fatalf("first: %d stored, %d unknown", ok, unknown)
	}
	if ok, unknown := checkOutcomes(t, db, kept, 3); ok != 3 || unknown != 0 {
		t.Fatalf("kept: %d stored, %d unknown", ok, unknown)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE event_id = 'withdrawn'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the withdrawn event is stored %d times (%v)", n, err)
	}
}
