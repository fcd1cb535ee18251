package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/sqlitestore"
)

// Tests of the SQLite store under a replayd hub, where the store's inside
// must be reached (see export_test.go).

const waitFor = wiretest.WaitFor

func openDB(t testing.TB, path string) (*sql.DB, string) {
	t.Helper()
	db, err := sqlitestore.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

func openTestDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	return openDB(t, filepath.Join(t.TempDir(), "events.db"))
}

// newTestHub returns a hub over a SQLite store on db, both closed at the
// end of the test, and the store.
func newTestHub(t testing.TB, db *sql.DB) (*replayd.EventHub, *sqlitestore.Store) {
	t.Helper()
	s, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		s.Close()
	})
	return h, s
}

func mustPublish(t testing.TB, h *replayd.EventHub, topic string, payload any) replayd.Event {
	t.Helper()
	ev, err := h.Publish(context.Background(), topic, payload)
	if err != nil {
		t.Fatalf("publish %q: %v", topic, err)
	}
	return ev
}

// A storm of slow handshakes must queue handshakes only: a publish that
// needs the writer's connection and a live catch-up that needs a read of
// rows another process committed both go through (issue 8, item 1).
func TestHandshakeStormDoesNotStallPublish(t *testing.T) {
	db, path := openTestDB(t)
	h, s := newTestHub(t, db)
	for i := range 10 {
		mustPublish(t, h, "a", i)
	}
	got := make(chan int64, 100)
	unsub := h.Subscribe(func(ev replayd.Event) { got <- ev.Sequence })
	defer unsub()

	// Every handshake that reaches the log holds its connection until
	// release is closed.
	entered := make(chan struct{}, 100)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	sqlitestore.SetTestHookHandshake(s, func() {
		entered <- struct{}{}
		<-release
	})
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	const storm = 20
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); unblock(); wg.Wait() }()
	hellos := make(chan bool, storm)
	for range storm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"?topic=a", nil)
			req.Header.Set("Last-Event-ID", "0")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				hellos <- false
				return
			}
			defer resp.Body.Close()
			frames := make(chan wiretest.Frame, 64)
			go wiretest.ReadFrames(resp.Body, frames)
			select {
			case f := <-frames:
				hellos <- f.Event == "hello"
			case <-ctx.Done():
				hellos <- false
			}
		}()
	}
	for range max(db.Stats().MaxOpenConnections-2, 1) { // the hub's handshake slots
		select {
		case <-entered:
		case <-time.After(waitFor):
			t.Fatal("no handshake reached the log")
		}
	}

	// Another process commits three rows; this hub's next publish must
	// catch up on them (a pooled read) and commit its own (the writer).
	db2, _ := openDB(t, path)
	h2, _ := newTestHub(t, db2)
	var want []int64
	for i := range 3 {
		want = append(want, mustPublish(t, h2, "b", i).Sequence)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	start := time.Now()
	ev, err := h.Publish(pctx, "a", "during the storm")
	if err != nil {
		t.Fatalf("publish during a handshake storm: %v after %v", err, time.Since(start))
	}
	if ev.Sequence != want[2]+1 {
		t.Fatalf("published sequence %d, want %d", ev.Sequence, want[2]+1)
	}
	for _, want := range append(want, ev.Sequence) {
		select {
		case seq := <-got:
			if seq != want {
				t.Fatalf("subscriber got %d, want %d", seq, want)
			}
		case <-time.After(waitFor):
			t.Fatalf("subscriber never got %d", want)
		}
	}
	unblock()
	for range storm {
		select {
		case ok := <-hellos:
			if !ok {
				t.Fatal("a client of the storm got no hello")
			}
		case <-time.After(waitFor):
			t.Fatal("the storm's clients were not all served")
		}
	}
}

// A database another connection keeps write-locked makes Ready fail within
// its context's deadline, also while this hub's writer is itself waiting
// for the lock; once the lock is released, Ready and Publish work again.
func TestReadyLockedDatabase(t *testing.T) {
	db, path := openTestDB(t)
	h, s := newTestHub(t, db)
	mustPublish(t, h, "a", 1)

	other, err := sqlitestore.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	locked := true
	unlock := func() {
		if locked {
			locked = false
			if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer unlock()

	const deadline = 300 * time.Millisecond
	took, err := wiretest.ReadyWithin(h.Ready, deadline)
	if !errors.Is(err, context.DeadlineExceeded) || took > deadline+time.Second {
		t.Fatalf("Ready on a locked database: %v after %v, want a deadline error within %v", err, took, deadline)
	}
	if code, _ := wiretest.GetReady(t, h.ReadyHandler()); code != http.StatusServiceUnavailable {
		t.Fatalf("ReadyHandler on a locked database: %d", code)
	}

	// Now the hub's own writer waits for the lock with a publish.
	published := make(chan error, 1)
	go func() {
		_, err := h.Publish(context.Background(), "a", 2)
		published <- err
	}()
	wiretest.WaitUntil(t, "the writer to hold writeMu", func() bool {
		return sqlitestore.WriteLocked(s)
	})
	took, err = wiretest.ReadyWithin(h.Ready, deadline)
	if !errors.Is(err, context.DeadlineExceeded) || took > deadline+time.Second {
		t.Fatalf("Ready behind a waiting writer: %v after %v", err, took)
	}

	unlock()
	if err := <-published; err != nil {
		t.Fatalf("publish once unlocked: %v", err)
	}
	if _, err := wiretest.ReadyWithin(h.Ready, waitFor); err != nil {
		t.Fatalf("Ready once unlocked: %v", err)
	}
	mustPublish(t, h, "a", 3)
}
