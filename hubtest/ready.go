package hubtest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// getReady asks h's ReadyHandler over real HTTP and returns status and body.
func getReady(t *testing.T, h *replayd.EventHub) (int, string) {
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

func readyWithin(h *replayd.EventHub, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := h.Ready(ctx)
	return time.Since(start), err
}

// Ready answers nil on a healthy log, writes nothing, and leaves the
// writer usable; after Close it is ErrClosed and the handler says 503.
// (The root package's TestReady checks the same of an in-memory SQLite
// database.)
func testReady(t *testing.T, newLog func(t *testing.T) opener) {
	h := newLog(t)(replayd.Options{})
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
	if _, err := readyWithin(h, waitFor); !errors.Is(err, replayd.ErrClosed) {
		t.Fatalf("Ready after Close: %v", err)
	}
	if code, body := getReady(t, h); code != http.StatusServiceUnavailable || body != "not ready\n" {
		t.Fatalf("ReadyHandler after Close: %d %q", code, body)
	}
}
