package replaydpg

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd"
)

// holdHead begins a transaction on pool that takes the head row's lock of
// the tables under prefix, as a stuck or slow transaction would, and
// returns it and its server process id. Rolling it back releases the lock;
// the test's end does so if the test did not.
func holdHead(t testing.TB, pool *pgxpool.Pool, prefix string) (pgx.Tx, int32) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM `+prefix+`head WHERE id = 1 FOR UPDATE`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

// eventually polls cond every few milliseconds until it is true, and fails
// the test if it is not within d or returns an error. It stands for a
// signal the server does not give (a session queued on a lock, a commit
// by a session the test cannot reach).
func eventually(t testing.TB, d time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			t.Fatalf("waiting for %s: %v", what, err)
		case ok:
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v", what, d)
		case <-tick.C:
		}
	}
}

// waitBlockedBy waits until exactly n sessions wait for a lock that the session
// pid holds.
func waitBlockedBy(t testing.TB, pool *pgxpool.Pool, pid int32, n int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("%d sessions to queue behind session %d", n, pid), func(ctx context.Context) (bool, error) {
		var k int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, pid).Scan(&k)
		return k == n, err
	})
}

// storedSequence waits until the event id is in the log under prefix and
// returns its sequence; it fails the test if it is stored more than once.
func storedSequence(t testing.TB, pool *pgxpool.Pool, prefix, id string) int64 {
	t.Helper()
	var seq int64
	eventually(t, 10*time.Second, "event "+id+" to be in the log", func(ctx context.Context) (bool, error) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(sequence), 0) FROM `+prefix+`events WHERE event_id = $1`, id).Scan(&n, &seq)
		if n > 1 {
			t.Fatalf("event %s is stored %d times", id, n)
		}
		return n == 1, err
	})
	return seq
}

// rowCount counts the rows of the event id under prefix.
func rowCount(t testing.TB, pool *pgxpool.Pool, prefix, id string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(testCtx(t, 10*time.Second), `SELECT count(*) FROM `+prefix+`events WHERE event_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPublishOutcomeUnknown breaks the hub's connection after its append
// was sent: the server has the whole pipeline but is queued on the head
// row's lock (another transaction holds it) when a proxy between them
// cuts every connection and lets no new one through. Publish cannot know whether the event will be
// stored, and must say so with ErrOutcomeUnknown; the server then gets
// the lock and commits the event, which another node delivers; publishing
// the same event id again returns the stored event.
func TestPublishOutcomeUnknown(t *testing.T) {
	dsn, prefix := testDSN(t), testPrefix(t)
	px := newTestProxy(t, dsn)
	s := openPrefixDSN(t, prefix, px.dsn)
	hub, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	ctx := testCtx(t, 60*time.Second)
	if _, err := hub.Publish(ctx, "t", "warm-up"); err != nil {
		t.Fatal(err)
	}
	// Another node, on a store of its own, tailing the log.
	other, err := replayd.NewWithStore(openPrefixDSN(t, prefix, dsn), replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	stop, err := other.StartTail(time.Hour, replayd.TailOptions{}) // NOTIFY wakes it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	delivered := make(chan replayd.Event, 16)
	t.Cleanup(other.Subscribe(func(ev replayd.Event) { delivered <- ev }))

	raw := testPool(t)
	tx, pid := holdHead(t, raw, prefix)

	type result struct {
		ev  replayd.Event
		err error
	}
	done := make(chan result, 1)
	go func() {
		ev, err := hub.Publish(ctx, "t", map[string]int{"n": 1}, replayd.WithEventID("cut-1"))
		done <- result{ev, err}
	}()
	waitBlockedBy(t, raw, pid, 1) // the append is on the server
	// A network fault: the connection breaks and no new one gets through,
	// so pgx's cancel request does not either.
	px.down.Store(true)
	cut := time.Now()
	if n := px.cut(); n == 0 {
		t.Fatal("no connection to cut")
	}
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("Publish did not return after its connection was cut")
	}
	t.Logf("Publish returned %v after the cut: %v", time.Since(cut).Round(time.Millisecond), r.err)
	if !errors.Is(r.err, replayd.ErrOutcomeUnknown) {
		t.Errorf("Publish after its connection broke mid-commit = %v, want an error wrapping ErrOutcomeUnknown", r.err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	seq := storedSequence(t, raw, prefix, "cut-1") // the server committed it all the same
	select {
	case got := <-delivered:
		if got.EventID != "cut-1" || got.Sequence != seq {
			t.Errorf("the other node delivered %+v, want cut-1 at %d", got, seq)
		}
	case <-ctx.Done():
		t.Fatal("the other node did not deliver the event")
	}
	px.down.Store(false)

	// The retry a caller makes on ErrOutcomeUnknown, until it knows. The
	// pool may hold other connections the proxy cut while they were idle
	// (the store's relay uses the pool too): one of those fails with
	// ErrOutcomeUnknown if the write got through before the failure showed,
	// or with an error proving nothing was sent (a broken pipe), on which a
	// caller retries as well.
	var ev replayd.Event
	for i := 0; ; i++ {
		ev, err = hub.Publish(ctx, "t", map[string]int{"n": 1}, replayd.WithEventID("cut-1"))
		if err == nil {
			break
		}
		if i == 3 {
			t.Fatalf("retry %d: %v", i, err)
		}
		t.Logf("retry %d: %v", i, err)
	}
	if ev.Sequence != seq || ev.EventID != "cut-1" || string(ev.Payload) != `{"n":1}` {
		t.Errorf("retry = %+v, want the stored event at sequence %d", ev, seq)
	}
	if n := rowCount(t, raw, prefix, "cut-1"); n != 1 {
		t.Errorf("event stored %d times", n)
	}
}

// TestAppendOutcome checks which of Append's errors wrap ErrOutcomeUnknown:
// every error once the batch may have reached the server, and none that
// proves nothing was stored.
func TestAppendOutcome(t *testing.T) {
	dsn := testDSN(t)
	raw := testPool(t)

	t.Run("ctx ends while the append waits for the lock", func(t *testing.T) {
		// pgx closes the connection and sends the server a cancel request,
		// which may land before or after the commit: Append cannot know.
		// Here it lands during the lock wait, so nothing is stored, and the
		// retry stores the event once.
		s, prefix := openTestStore(t)
		mustAppend(t, s, ev("warm-up", "t", `1`))
		tx, pid := holdHead(t, raw, prefix)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := s.Append(ctx, []replayd.Event{ev("ctx-1", "t", `2`)})
			done <- err
		}()
		waitBlockedBy(t, raw, pid, 1)
		cancel()
		err := <-done
		if !errors.Is(err, replayd.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
			t.Errorf("Append cancelled on the server = %v, want ErrOutcomeUnknown and context.Canceled", err)
		}
		waitBlockedBy(t, raw, pid, 0) // the cancel request landed
		tx.Rollback(context.Background())
		res := mustAppend(t, s, ev("ctx-1", "t", `2`))
		if n := rowCount(t, raw, prefix, "ctx-1"); n != 1 || res[0].Event.Sequence != storedSequence(t, raw, prefix, "ctx-1") {
			t.Errorf("retry = %+v; the event is stored %d times", res[0], n)
		}
	})

	t.Run("ctx done before", func(t *testing.T) {
		s, prefix := openTestStore(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := s.Append(ctx, []replayd.Event{ev("done-1", "t", `1`)})
		if err == nil || errors.Is(err, replayd.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
			t.Errorf("Append with a done ctx = %v, want context.Canceled without ErrOutcomeUnknown", err)
		}
		if n := rowCount(t, raw, prefix, "done-1"); n != 0 {
			t.Errorf("stored %d times", n)
		}
	})

	t.Run("server refuses the batch", func(t *testing.T) {
		prefix := testPrefix(t)
		s := openPrefixDSN(t, prefix, withDSNParam(dsn, "lock_timeout", "50"))
		mustAppend(t, s, ev("warm-up", "t", `1`))
		holdHead(t, raw, prefix)
		_, err := s.Append(testCtx(t, 10*time.Second), []replayd.Event{ev("lt-1", "t", `1`)})
		if err == nil || errors.Is(err, replayd.ErrOutcomeUnknown) {
			t.Errorf("Append refused by lock_timeout = %v, want an error without ErrOutcomeUnknown", err)
		}
		if n := rowCount(t, raw, prefix, "lt-1"); n != 0 {
			t.Errorf("stored %d times", n)
		}
	})

	t.Run("no connection", func(t *testing.T) {
		prefix := testPrefix(t)
		px := newTestProxy(t, dsn)
		s := openPrefixDSN(t, prefix, px.dsn)
		mustAppend(t, s, ev("warm-up", "t", `1`))
		px.down.Store(true)
		px.cut()
		s.pool.Reset() // forget the cut connections: the next Append connects
		_, err := s.Append(testCtx(t, 10*time.Second), []replayd.Event{ev("down-1", "t", `1`)})
		if err == nil || errors.Is(err, replayd.ErrOutcomeUnknown) {
			t.Errorf("Append without a server = %v, want an error without ErrOutcomeUnknown", err)
		}
		if n := rowCount(t, raw, prefix, "down-1"); n != 0 {
			t.Errorf("stored %d times", n)
		}
	})
}

// TestCloseDuringCommitOutcomeUnknown closes the hub while its append
// waits on the server for the head row's lock: Close cancels the commit
// after its grace, and the publish cannot know whether the server
// committed. It must say ErrOutcomeUnknown, not ErrClosed (which
// promises nothing was stored).
func TestCloseDuringCommitOutcomeUnknown(t *testing.T) {
	s, prefix := openTestStore(t)
	hub, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 60*time.Second)
	if _, err := hub.Publish(ctx, "t", "warm-up"); err != nil {
		t.Fatal(err)
	}
	raw := testPool(t)
	tx, pid := holdHead(t, raw, prefix)
	done := make(chan error, 1)
	go func() {
		_, err := hub.Publish(ctx, "t", 1, replayd.WithEventID("close-1"))
		done <- err
	}()
	waitBlockedBy(t, raw, pid, 1)
	if err := hub.Close(); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, replayd.ErrOutcomeUnknown) || errors.Is(err, replayd.ErrClosed) {
		t.Errorf("Publish whose commit Close cancelled = %v, want ErrOutcomeUnknown and not ErrClosed", err)
	}
	tx.Rollback(ctx)
}
