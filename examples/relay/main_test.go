package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/headless"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// net/http keeps these by design.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// relayServer serves the example's mux over real HTTP, on a hub on SQLite
// in t.TempDir(), with an upstream of tokens writes, one every every.
func relayServer(t *testing.T, tokens int, every time.Duration) (*httptest.Server, *replayd.Jobs) {
	t.Helper()
	db, err := replayd.OpenDB(filepath.Join(t.TempDir(), "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	hub, err := replayd.New(db, replayd.Options{SSE: replayd.SSEOptions{Retry: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	jobs, err := hub.Jobs(replayd.JobsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newMux(hub, jobs, upstream{tokens: tokens, every: every}))
	t.Cleanup(srv.Close)
	// Registered last, so it runs first: the streams end before the
	// server's Close waits for its connections.
	t.Cleanup(func() { hub.Close() })
	return srv, jobs
}

// startJob starts a job over the stream-relay protocol and returns its id.
func startJob(t *testing.T, srv *httptest.Server, prompt string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"payload": map[string]string{"prompt": prompt}})
	resp, err := http.Post(srv.URL+"/relay/streams", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct {
		ProtocolVersion int    `json:"protocolVersion"`
		StreamID        string `json:"streamId"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != 200 || a.ProtocolVersion != 2 || a.StreamID == "" {
		t.Fatalf("POST /relay/streams: %d %+v, %v", resp.StatusCode, a, err)
	}
	return a.StreamID
}

// clientOptions reach the example's /events and /poll.
func clientOptions(srv *httptest.Server, tr client.Transport) client.Options {
	return client.Options{SSE: srv.URL + "/events", Poll: srv.URL + "/poll", Transport: tr,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, PollWait: 2 * time.Second}
}

// runJob runs job.Run for at most waitFor.
func runJob(t *testing.T, ctx context.Context, job *client.Job, handle func(client.JobUpdate) error) (*client.JobEnd, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, relayWaitFor)
	defer cancel()
	return job.Run(ctx, handle)
}

// A job started over the stream-relay protocol, followed with the Go
// client over SSE and over polls at once, and by a third follower stopped
// mid-answer and resumed from its saved state (as a process restarted):
// each ends complete with the upstream's text byte for byte (characters
// of two UTF-16 units, some cut across writes), the tool call's and the
// usage events once each, the last progress and the metadata; a
// stream-relay poll of the finished job answers the same text.
func TestRelayFollowedByTheGoClient(t *testing.T) {
	srv, _ := relayServer(t, 300, 2*time.Millisecond)
	id := startJob(t, srv, "why?")
	want := answerText(id, 300)

	type result struct {
		what string
		job  *client.Job
		end  *client.JobEnd
		err  error
	}
	results := make(chan result, 3)
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		go func() {
			job := client.NewJob(client.JobOptions{Options: clientOptions(srv, tr), Job: id})
			end, err := runJob(t, t.Context(), job, nil)
			results <- result{string(tr), job, end, err}
		}()
	}
	go func() {
		job := client.NewJob(client.JobOptions{Options: clientOptions(srv, client.SSE), Job: id})
		ctx, stop := context.WithCancel(t.Context())
		_, err := runJob(t, ctx, job, func(u client.JobUpdate) error {
			if u.Text != nil && u.Text.Offset+int64(len(u.Text.Chunk)) > 200 {
				stop() // mid-answer: the process goes away
			}
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			results <- result{"stopped", job, nil, err}
			return
		}
		saved, _ := json.Marshal(job.State())
		var st client.JobState
		json.Unmarshal(saved, &st)
		again := client.NewJob(client.JobOptions{Options: clientOptions(srv, client.Poll), Job: id, State: &st})
		end, err := runJob(t, t.Context(), again, func(u client.JobUpdate) error {
			if u.Text != nil && u.Text.Offset < st.Next {
				return errors.New("text handed again after the resume")
			}
			return nil
		})
		results <- result{"resumed", again, end, err}
	}()
	for range 3 {
		r := <-results
		if r.err != nil || r.end == nil || r.end.Status != "complete" {
			t.Fatalf("%s: end %+v, %v", r.what, r.end, r.err)
		}
		st := r.job.State()
		if st.Text != want {
			t.Fatalf("%s: the text differs from the upstream's:\n got %q\nwant %q", r.what, st.Text, want)
		}
		var types []string
		for _, e := range st.Events {
			var ev struct{ Type string }
			json.Unmarshal(e, &ev)
			types = append(types, ev.Type)
		}
		var meta struct{ OutputTokens, Bytes int }
		json.Unmarshal(r.end.Meta, &meta)
		var pr struct{ Phase string }
		json.Unmarshal(st.Progress, &pr)
		if strings.Join(types, " ") != "tool.start tool.end usage" || len(st.Gaps) != 0 || meta.OutputTokens != 300 ||
			meta.Bytes != len(want) || pr.Phase != "generation" {
			t.Fatalf("%s: events %v, gaps %v, meta %s, progress %s", r.what, types, st.Gaps, r.end.Meta, st.Progress)
		}
	}

	resp, err := http.Get(srv.URL + "/relay/streams/" + id + "?since=0&eventSince=0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var poll struct {
		Status string `json:"status"`
		Final  struct {
			Text string `json:"text"`
		} `json:"final"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&poll); err != nil || poll.Status != "complete" || poll.Final.Text != want {
		t.Fatalf("stream-relay poll: %s, %d units of final text, %v", poll.Status, len(poll.Final.Text), err)
	}
}

// The relay page in headless Chromium: a page reloaded twice in the middle
// of an answer ends with the text the upstream wrote, byte for byte, each
// event once, and the end complete; a second tab on the same job reads the
// same. Skips without Chromium, unless REPLAYD_BROWSER_TESTS=1 (as CI
// sets).
func TestRelayPageSurvivesReloads(t *testing.T) {
	browser := relayBrowser(t)
	srv, _ := relayServer(t, 300, 10*time.Millisecond)
	id := startJob(t, srv, "why?")
	want := answerText(id, 300)

	tab := relayTab(t, browser)
	relayDo(t, tab, func(ctx context.Context) error { return headless.Navigate(ctx, srv.URL+"/#"+id) })
	relayWait(t, tab, "some text", func(s relayState) bool { return len(s.Text) >= 200 })
	relayDo(t, tab, headless.Reload)
	relayWait(t, tab, "more text", func(s relayState) bool { return s.Restored == 1 && len(s.Text) >= len(want)/2 })
	relayDo(t, tab, headless.Reload)
	st := relayWait(t, tab, "the answer", func(s relayState) bool { return s.End != nil })
	if st.Text != want || st.End.Status != "complete" || st.Restored != 1 || len(st.Gaps) != 0 ||
		strings.Join(st.eventTypes(), " ") != "tool.start tool.end usage" || st.Progress == nil || st.Progress.Phase != "generation" {
		t.Fatalf("after two reloads the page shows %d bytes (end %+v, restored %d, gaps %v, events %v); want %d bytes, equal text\n got %q\nwant %q",
			len(st.Text), st.End, st.Restored, st.Gaps, st.eventTypes(), len(want), st.Text, want)
	}

	other := relayTab(t, browser)
	relayDo(t, other, func(ctx context.Context) error { return headless.Navigate(ctx, srv.URL+"/#"+id) })
	st = relayWait(t, other, "the answer in a second tab", func(s relayState) bool { return s.End != nil })
	if st.Text != want || st.Restored != 0 {
		t.Fatalf("a second tab shows %q (restored %d), want %q", st.Text, st.Restored, want)
	}
}

// relayState is the page's window.relay.
type relayState struct {
	Text   string            `json:"text"`
	Events []json.RawMessage `json:"events"`
	End    *struct {
		Status string `json:"status"`
	} `json:"end"`
	Progress *struct {
		Phase string `json:"phase"`
	} `json:"progress"`
	Gaps     []json.RawMessage `json:"gaps"`
	Restored int               `json:"restored"` // lives of the page that got the text so far restored
}

func (s relayState) eventTypes() []string {
	var out []string
	for _, e := range s.Events {
		var ev struct{ Type string }
		json.Unmarshal(e, &ev)
		out = append(out, ev.Type)
	}
	return out
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
			t.Fatalf("timed out waiting for %s (last error %v): %q", what, err, st.Text)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
