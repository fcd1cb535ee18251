package replayd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

// End-to-end tests of the poll endpoint (PollHandler) over real HTTP and
// real SQLite files.

// pollJSON is a poll answer as a client decodes it.
type pollJSON struct {
	Topics []string `json:"topics"`
	Cursor int64    `json:"cursor"`
	Head   int64    `json:"head"`
	More   bool     `json:"more"`
	Gap    *gapJSON `json:"gap"`
	Events []struct {
		ID    int64           `json:"id"`
		Type  string          `json:"type"`
		Topic *string         `json:"topic"`
		Data  json.RawMessage `json:"data"`
	} `json:"events"`
}

// servePoll starts a real HTTP server with the SSE endpoint at /events and
// the poll endpoint at /poll.
func servePoll(t testing.TB, h *EventHub) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/events", h.Handler())
	mux.Handle("/poll", h.PollHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// getPoll sends one poll request and returns its status, headers and body.
func getPoll(t testing.TB, base, query string) (int, http.Header, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/poll?"+query, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

// poll sends one poll request that must be answered 200 and decodes it.
func poll(t testing.TB, base, query string) pollJSON {
	t.Helper()
	status, _, body := getPoll(t, base, query)
	if status != http.StatusOK {
		t.Fatalf("poll %q: %d %s", query, status, body)
	}
	var p pollJSON
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("poll %q: %v: %s", query, err, body)
	}
	return p
}

func TestPollClientLeavingReleasesItsWait(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{MaxConnections: 1}})
	base := servePoll(t, h)
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
	status, hdr, _ := getPoll(t, base, "topic=a&cursor=0")
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
	if p := poll(t, base, "topic=a&cursor=0"); p.Head != 0 {
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
	base := servePoll(t, h)
	got := make(chan pollJSON, 1)
	go func() { got <- poll(t, base, "topic=a&cursor=0&wait=20") }()
	deadline := time.Now().Add(waitFor)
	for h.metrics.pollConns.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the poll never waited")
		}
		time.Sleep(time.Millisecond)
	}
	child := crashStart(t, "TestPollLongPollWokenThroughTail", pollChildEnv+"="+path)
	if state := child.wait(); !state.Success() {
		t.Fatalf("child: %v: %s", state, child.stderr())
	}
	select {
	case p := <-got:
		if len(p.Events) != 1 || string(p.Events[0].Data) != `"from the child"` {
			t.Fatalf("woken with %+v", p)
		}
	case <-time.After(waitFor):
		t.Fatal("the poll was not woken by the other process's row")
	}
}

const pollChildEnv = "REPLAYD_POLL_CHILD"
