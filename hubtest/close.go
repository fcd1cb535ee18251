package hubtest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Close ends everything the hub started, and refuses what comes after.

func testCloseStopsEverything(t *testing.T, newLog func(t *testing.T) opener) {
	h := newLog(t)(replayd.Options{})
	stopTail, err := h.StartTail(time.Millisecond, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stopRet := h.StartRetention(replayd.RetentionPolicy{MaxEvents: 1}, time.Millisecond)
	srv := serve(t, h)
	c := wiretest.Dial(t, srv.URL, nil)
	c.Hello()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NextErr(waitFor); err == nil || errors.Is(err, wiretest.ErrTimeout) {
		t.Fatalf("stream not ended by Close: %v", err)
	}
	// A new connection is ended at once, with a 200 so that a browser
	// reconnects (elsewhere, or when the server is back) instead of giving up.
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" || !strings.HasPrefix(string(body), ": ") {
		t.Fatalf("after Close: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if _, err := h.Publish(context.Background(), "a", 1); !errors.Is(err, replayd.ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
	if _, err := h.StartTail(time.Second, replayd.TailOptions{}); !errors.Is(err, replayd.ErrClosed) {
		t.Fatalf("StartTail after close: %v", err)
	}
	h.StartRetention(replayd.RetentionPolicy{MaxEvents: 1}, time.Second)() // a no-op
	stopTail()
	stopRet()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	// goleak in TestMain (the root package's, replaydpg's) checks that
	// nothing the hub started survives.
}
