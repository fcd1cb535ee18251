package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/headless"
)

// The relay page in headless Chromium: a page reloaded twice in the middle
// of an answer ends with the text the upstream wrote, byte for byte, and a
// second tab on the same job reads the same text. Skips without Chromium,
// unless REPLAYD_BROWSER_TESTS=1 (as CI sets).
func TestRelayPageSurvivesReloads(t *testing.T) {
	browser := relayBrowser(t)

	db, err := replayd.OpenDB(filepath.Join(t.TempDir(), "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	hub, err := replayd.New(db, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: replayLimit, Retry: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	r := &relay{hub: hub, logger: slog.New(slog.DiscardHandler), up: upstream{chunks: 300, every: 10 * time.Millisecond}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	t.Cleanup(r.wait)
	t.Cleanup(r.cancel)
	srv := httptest.NewServer(newMux(r))
	t.Cleanup(srv.Close)
	// Registered last, so it runs first: the tabs' streams end before the
	// server's Close waits for its connections.
	t.Cleanup(func() { hub.Close() })

	resp, err := http.Post(srv.URL+"/jobs", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var job struct{ ID, Topic string }
	err = json.NewDecoder(resp.Body).Decode(&job)
	resp.Body.Close()
	if err != nil || job.Topic != "job-"+job.ID {
		t.Fatalf("POST /jobs: %+v, %v", job, err)
	}
	var want strings.Builder
	for i := range r.up.chunks {
		want.WriteString(chunkText(job.ID, i))
	}

	tab := relayTab(t, browser)
	relayDo(t, tab, func(ctx context.Context) error { return headless.Navigate(ctx, srv.URL+"/#"+job.ID) })
	relayWait(t, tab, "50 chunks", func(s relayState) bool { return s.Chunks >= 50 })
	relayDo(t, tab, headless.Reload)
	relayWait(t, tab, "150 chunks", func(s relayState) bool { return s.Chunks >= 150 })
	relayDo(t, tab, headless.Reload)
	st := relayWait(t, tab, "the answer", func(s relayState) bool { return s.Done != nil })
	if st.Text != want.String() || st.Chunks != r.up.chunks || st.Done.Bytes != want.Len() {
		t.Fatalf("after two reloads the page shows %d chunks, %d bytes (done: %+v); want %d chunks, %d bytes, equal text\n got %q\nwant %q",
			st.Chunks, len(st.Text), st.Done, r.up.chunks, want.Len(), st.Text, want.String())
	}

	other := relayTab(t, browser)
	relayDo(t, other, func(ctx context.Context) error { return headless.Navigate(ctx, srv.URL+"/#"+job.ID) })
	st = relayWait(t, other, "the answer in a second tab", func(s relayState) bool { return s.Done != nil })
	if st.Text != want.String() {
		t.Fatalf("a second tab shows %q, want %q", st.Text, want.String())
	}
}

// relayState is the page's window.relay.
type relayState struct {
	Text   string `json:"text"`
	Chunks int    `json:"chunks"`
	Done   *struct {
		Chunks int `json:"chunks"`
		Bytes  int `json:"bytes"`
	} `json:"done"`
}

const relayWaitFor = 20 * time.Second

// relayBrowser starts a headless Chromium for the test.
func relayBrowser(t *testing.T) context.Context {
	t.Helper()
	ctx, stop, err := headless.Start(headless.ExecPath(t), t.TempDir(), t.Logf, relayWaitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ctx
}

// relayTab opens a tab in a fresh browser context.
func relayTab(t *testing.T, browser context.Context) context.Context {
	t.Helper()
	ctx, cancel, err := headless.NewTab(browser, relayWaitFor)
	if err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	t.Cleanup(cancel)
	return ctx
}

// relayDo runs do (headless.Navigate or headless.Reload) on the tab, for
// at most relayWaitFor.
func relayDo(t *testing.T, tab context.Context, do func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, relayWaitFor)
	defer cancel()
	if err := do(ctx); err != nil {
		t.Fatal(err)
	}
}

// relayWait reads window.relay until cond holds, for at most relayWaitFor.
func relayWait(t *testing.T, tab context.Context, what string, cond func(relayState) bool) relayState {
	t.Helper()
	deadline := time.Now().Add(relayWaitFor)
	for {
		ctx, cancel := context.WithTimeout(tab, 5*time.Second)
		st, err := headless.Evaluate[relayState](ctx, `window.relay || {}`)
		cancel()
		if err == nil && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error %v): %d chunks, %q", what, err, st.Chunks, st.Text)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
