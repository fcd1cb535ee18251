package replayd

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// getReady asks h's ReadyHandler over real HTTP and returns status and body.
func getReady(t *testing.T, h *EventHub) (int, string) {
	t.Helper()
	srv := httptest.NewServer(h.ReadyHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func readyWithin(h *EventHub, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := h.Ready(ctx)
	return time.Since(start), err
}

// Ready answers nil on a healthy in-memory database, writes nothing, and
// leaves the writer usable; after Close it is ErrClosed and the handler
// says 503. (On a file, and on every store: hubtest's Ready.)
func TestReady(t *testing.T) {
	db, err := OpenDB(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h := newTestHub(t, db, Options{})
	ev := mustPublish(t, h, "a", 1)
	for range 3 {
		if _, err := readyWithin(h, waitFor); err != nil {
			t.Fatalf("Ready: %v", err)
		}
	}
	if code, body := getReady(t, h); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("ReadyHandler: %d %q", code, body)
	}
	if head, _ := h.LatestSequence(context.Background()); head != ev.Sequence {
		t.Fatalf("head %d after Ready, want %d: the probe wrote", head, ev.Sequence)
	}
	if ev2 := mustPublish(t, h, "a", 2); ev2.Sequence != ev.Sequence+1 {
		t.Fatalf("publish after Ready got %d", ev2.Sequence)
	}
	h.Close()
	if _, err := readyWithin(h, waitFor); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ready after Close: %v", err)
	}
	if code, body := getReady(t, h); code != http.StatusServiceUnavailable || body != "not ready\n" {
		t.Fatalf("ReadyHandler after Close: %d %q", code, body)
	}
}

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
	took, err := readyWithin(h, deadline)
	if !errors.Is(err, context.DeadlineExceeded) || took > deadline+time.Second {
		t.Fatalf("Ready on a locked database: %v after %v, want a deadline error within %v", err, took, deadline)
	}
	if code, _ := getReady(t, h); code != http.StatusServiceUnavailable {
		t.Fatalf("ReadyHandler on a locked database: %d", code)
	}

	// Now the hub's own writer waits for the lock with a publish.
	published := make(chan error, 1)
	go func() {
		_, err := h.Publish(context.Background(), "a", 2)
		published <- err
	}()
	waitUntil(t, "the writer to hold writeMu", func() bool {
		if mu := &h.store.s.(*sqliteStore).writeMu; mu.TryLock() {
			mu.Unlock()
			return false
		}
		return true
	})
	took, err = readyWithin(h, deadline)
	if !errors.Is(err, context.DeadlineExceeded) || took > deadline+time.Second {
		t.Fatalf("Ready behind a waiting writer: %v after %v", err, took)
	}

	unlock()
	if err := <-published; err != nil {
		t.Fatalf("publish once unlocked: %v", err)
	}
	if _, err := readyWithin(h, waitFor); err != nil {
		t.Fatalf("Ready once unlocked: %v", err)
	}
	mustPublish(t, h, "a", 3)
}
