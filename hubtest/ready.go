package hubtest

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Ready answers nil on a healthy log, writes nothing, and leaves the
// writer usable; after Close it is ErrClosed and the handler says 503.
// (The root package's TestHubSuite/Memory checks the same of an in-memory
// SQLite database.)
func testReady(t *testing.T, newLog func(t *testing.T) opener) {
	h := newLog(t)(replayd.Options{})
	ev := mustPublish(t, h, "a", 1)
	for range 3 {
		if _, err := wiretest.ReadyWithin(h.Ready, waitFor); err != nil {
			t.Fatalf("Ready: %v", err)
		}
	}
	if code, body := wiretest.GetReady(t, h.ReadyHandler()); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("ReadyHandler: %d %q", code, body)
	}
	if head, _ := h.LatestSequence(context.Background()); head != ev.Sequence {
		t.Fatalf("head %d after Ready, want %d: the probe wrote", head, ev.Sequence)
	}
	if ev2 := mustPublish(t, h, "a", 2); ev2.Sequence != ev.Sequence+1 {
		t.Fatalf("publish after Ready got %d", ev2.Sequence)
	}
	h.Close()
	if _, err := wiretest.ReadyWithin(h.Ready, waitFor); !errors.Is(err, replayd.ErrClosed) {
		t.Fatalf("Ready after Close: %v", err)
	}
	if code, body := wiretest.GetReady(t, h.ReadyHandler()); code != http.StatusServiceUnavailable || body != "not ready\n" {
		t.Fatalf("ReadyHandler after Close: %d %q", code, body)
	}
}
