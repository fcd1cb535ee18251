package replayd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
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
	waiters := h.live.WaiterSets()
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

// A poll the log cannot answer gets 503 with Retry-After and an error body
// that cannot pass for an answer, and the failure is logged (issue 17, row
// 6): it was a 503 holding a well-formed empty answer, cursor 0,
// which a client reading the body without the status would have taken.
// The same for a waiting poll whose read fails when it is woken, and for
// a poll that arrives while the hub is closing.
func TestPollReadErrorIsAnErrorAnswer(t *testing.T) {
	db, _ := openTestDB(t)
	s, err := NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.(io.Closer).Close() })
	fs := &faultyStore{Store: s}
	logs := &wiretest.LogRecorder{}
	h, err := NewWithStore(fs, Options{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	base := wiretest.ServePoll(t, h)
	ev := mustPublish(t, h, "a", 1)
	checkErrorAnswer := func(what string, status int, hdr http.Header, body []byte) {
		t.Helper()
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(body, &keys); err != nil {
			t.Fatalf("%s: body %q: %v", what, body, err)
		}
		var msg string
		if status != http.StatusServiceUnavailable || hdr.Get("Content-Type") != "application/json" ||
			hdr.Get("Cache-Control") != "no-store" || len(keys) != 1 || json.Unmarshal(keys["error"], &msg) != nil || msg == "" {
			t.Fatalf("%s: %d %v %s, want 503 and {\"error\":…}", what, status, hdr, body)
		}
		if secs, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || secs < 1 {
			t.Fatalf("%s: Retry-After %q", what, hdr.Get("Retry-After"))
		}
	}

	fs.failReads.Store(true) // global reads fail: a poll without a topic
	status, hdr, body := wiretest.GetPoll(t, base, "cursor=0")
	checkErrorAnswer("read error", status, hdr, body)
	if n := logs.Count(slog.LevelError, "replayd: read the log for a poll", "err", "injected read failure"); n != 1 {
		t.Fatalf("%d log records of the failed read:\n%s", n, logs)
	}

	// A waiting poll: its first read fails.
	status, hdr, body = wiretest.GetPoll(t, base, fmt.Sprintf("cursor=%d&wait=10", ev.Sequence))
	checkErrorAnswer("waiting poll", status, hdr, body)

	fs.failReads.Store(false)
	if p := wiretest.Poll(t, base, "cursor=0"); len(p.Events) != 1 {
		t.Fatalf("after the fault: %+v", p)
	}
	h.Close()
	status, hdr, body = wiretest.GetPoll(t, base, "cursor=0")
	checkErrorAnswer("closed hub", status, hdr, body)
}

// The kits (hubtest, chaostest) hold answers to the hub's byte bound.
func TestPollPageBytesShared(t *testing.T) {
	if pollPageBytes != wiretest.PollPageBytes {
		t.Fatalf("the hub cuts poll answers at %d bytes, the kits expect %d", pollPageBytes, wiretest.PollPageBytes)
	}
}
