package replayd

import (
	"log/slog"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// Tests of one stream's shape and limits: the retry field's placement, the
// queue cap against the largest frame, and a ResponseWriter that cannot
// flush.

// A client cut as a slow consumer is logged, with its topic and address.
func TestSSESlowConsumerCutIsLogged(t *testing.T) {
	db, _ := openTestDB(t)
	logs := &wiretest.LogRecorder{}
	h := newTestHub(t, db, Options{Logger: slog.New(logs), SSE: SSEOptions{MaxBufferedBytes: 1, HeartbeatInterval: -1}})
	release := make(chan struct{})
	h.testHookBeforeLive = func() { <-release }
	srv := serve(t, h)
	c := wiretest.Dial(t, srv.URL+"?topic=slow", nil)
	c.Hello()
	// The handler is held before going live: the first frame is queued
	// although it passes the 1-byte cap, the second cuts the client.
	mustPublish(t, h, "slow", 1)
	mustPublish(t, h, "slow", 2)
	close(release)
	if f, err := c.NextErr(waitFor); err == nil {
		t.Fatalf("stream went on with %+v, want it cut", f)
	}
	wiretest.WaitUntil(t, "the cut logged", func() bool {
		return logs.Has(slog.LevelInfo, "slow consumer", "topics", "slow") && logs.Has(slog.LevelInfo, "slow consumer", "remote", "")
	})
}
