package replayd

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// A database another connection keeps write-locked makes Ready fail within
// its context's deadline, also while this hub's writer is itself waiting
// for the lock; once the lock is released, Ready and Publish work again.
func TestReadyLockedDatabase(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	mustPublish(t, h, "a", 1)

	other, err := OpenDB(path)
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
		if mu := &h.store.s.(*sqliteStore).writeMu; mu.TryLock() {
			mu.Unlock()
			return false
		}
		return true
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
