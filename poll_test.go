package replayd

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// End-to-end tests of the poll endpoint (PollHandler) over real HTTP and
// real SQLite files.

func TestPollClientLeavingReleasesItsWait(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{MaxConnections: 1}})
	base := wiretest.ServePoll(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/poll?topic=a&cursor=0&wait=30", nil)
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(waitFor)
	for h.metrics.pollConns.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the poll never waited")
		}
		time.Sleep(time.Millisecond)
	}
	// The waiting poll holds the only slot: another poll is refused.
	status, hdr, _ := wiretest.GetPoll(t, base, "topic=a&cursor=0")
	if status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("at the cap: %d Retry-After %q", status, hdr.Get("Retry-After"))
	}
	cancel()
	for h.metrics.pollConns.Load() != 0 || h.conns.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the poll's wait was not released")
		}
		time.Sleep(time.Millisecond)
	}
	h.live.subsMu.Lock()
	waiters := len(h.live.waiters)
	h.live.subsMu.Unlock()
	if waiters != 0 {
		t.Fatalf("%d waiter sets left", waiters)
	}
	if p := wiretest.Poll(t, base, "topic=a&cursor=0"); len(p.Events) != 0 || p.Gap != nil {
		t.Fatalf("after the slot was freed: %+v", p)
	}
}

// A waiting long poll is woken by another process's row, through the tail.
func TestPollLongPollWokenThroughTail(t *testing.T) {
	if path := os.Getenv(pollChildEnv); path != "" {
		h, db := childHub(path)
		if _, err := h.Publish(context.Background(), "a", "from the child", WithEventID("child")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		h.Close()
		db.Close()
		os.Exit(0)
	}
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	stop, err := h.StartTail(10*time.Millisecond, TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	base := wiretest.ServePoll(t, h)
	answer := wiretest.PollLater(t, base, "topic=a&cursor=0&wait=20")
	wiretest.WaitUntil(t, "the poll to wait", func() bool { return h.metrics.pollConns.Load() == 1 })
	child := crashStart(t, "TestPollLongPollWokenThroughTail", pollChildEnv+"="+path)
	if state := child.wait(); !state.Success() {
		t.Fatalf("child: %v: %s", state, child.stderr())
	}
	// Not woken by the other process's row, the poll would wait its 20 s.
	if p := answer(); len(p.Events) != 1 || string(p.Events[0].Data) != `"from the child"` {
		t.Fatalf("woken with %+v", p)
	}
}

const pollChildEnv = "REPLAYD_POLL_CHILD"
