package replayd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/jobtest"

	"github.com/replayd/replayd/internal/headless"
)

// Browser tests of the module's followJob, in headless Chromium (the
// harness of browser_test.go): a page follows a job whose upstream is held
// at points the test chooses, and is reloaded mid-answer.

// jobPageHTML follows the job of the job parameter with the JSON options
// of opts, recording what each callback gets in this life of the page.
const jobPageHTML = `<!doctype html>
<meta charset="utf-8">
<title>replayd followJob test</title>
<script type="module">
import { followJob } from "/replayd.js";
const q = new URLSearchParams(location.search);
window.rec = {texts: [], events: [], gaps: [], ends: []};
window.job = followJob({
  ...JSON.parse(q.get("opts")),
  onText(t) { window.rec.texts.push(t); },
  onEvent(e, info) { window.rec.events.push({n: info.n, e: JSON.stringify(e), restored: info.restored}); },
  onGap(g) { window.rec.gaps.push(JSON.stringify(g)); },
  onEnd(end) { window.rec.ends.push(JSON.stringify(end)); },
});
window.ready = true;
</script>
`

// jobPageState is what the page recorded in its current life.
type jobPageState struct {
	Ready bool `json:"ready"`
	Rec   struct {
		Texts []struct {
			Chunk    string `json:"chunk"`
			Text     string `json:"text"`
			Offset   int    `json:"offset"`
			Restored bool   `json:"restored"`
		} `json:"texts"`
		Events []struct {
			N        int    `json:"n"`
			E        string `json:"e"`
			Restored bool   `json:"restored"`
		} `json:"events"`
		Gaps []string `json:"gaps"`
		Ends []string `json:"ends"`
	} `json:"rec"`
	Text string `json:"text"` // followJob's own text
}

// text is the concatenation of the chunks onText got in this life.
func (s jobPageState) text() string {
	var b strings.Builder
	for _, t := range s.Rec.Texts {
		b.WriteString(t.Chunk)
	}
	return b.String()
}

// jobGate holds an upstream between the phases of its answer.
type jobGate struct {
	phases [][]string
	next   chan struct{} // one receive per phase after the first
}

// run writes each phase's tokens, every gap, waiting on next before each
// phase after the first; an event before each phase.
func (g *jobGate) run(gap time.Duration) JobFunc {
	return func(ctx context.Context, w *JobWriter) (any, error) {
		for i, phase := range g.phases {
			if i > 0 {
				select {
				case <-g.next:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			if err := w.Emit(map[string]any{"type": "phase", "i": i}); err != nil {
				return nil, err
			}
			for _, tok := range phase {
				if _, err := w.WriteString(tok); err != nil {
					return nil, err
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(gap): // the upstream's pace, not a wait for the test
				}
			}
		}
		return map[string]any{"phases": len(g.phases)}, nil
	}
}

func TestBrowserFollowJob(t *testing.T) {
	browser := browserStart(t)
	t.Run("SSEReloads", func(t *testing.T) { jobTestReloads(t, browser, "sse") })
	t.Run("PollReloads", func(t *testing.T) { jobTestReloads(t, browser, "poll") })
	t.Run("PastReplayLimit", func(t *testing.T) { jobTestPastReplayLimit(t, browser) })
}

// jobServer serves a hub's jobs to the test page: the module, the page,
// Handler() at /events and PollHandler() at /poll.
func jobServer(t *testing.T, opts Options) (*Jobs, *browserServer) {
	t.Helper()
	db, _ := openTestDB(t)
	h := newTestHub(t, db, opts)
	j, err := h.Jobs(JobsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mux := browserMux(h.Handler())
	mux.Handle("/poll", h.PollHandler())
	mux.Handle("/replayd.js", ClientScript())
	mux.HandleFunc("/job", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprint(w, jobPageHTML)
	})
	srv := browserListen(t, "127.0.0.1:0", mux)
	t.Cleanup(func() { h.Close() }) // runs first: the streams end before the server's close
	return j, srv
}

// jobWait reads the page until cond holds, for at most browserWait; a read
// that fails (the page reloading) is retried.
func jobWait(t *testing.T, tab context.Context, what string, cond func(jobPageState) bool) jobPageState {
	t.Helper()
	deadline := time.Now().Add(browserWait)
	for {
		ctx, cancel := context.WithTimeout(tab, 5*time.Second)
		st, err := headless.Evaluate[jobPageState](ctx, `({ready: !!window.ready, rec: window.rec,
			text: window.job ? window.job.text : ""})`)
		cancel()
		if err == nil && st.Ready && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			b, _ := json.Marshal(st)
			t.Fatalf("timed out waiting for %s (last error %v): %s", what, err, b)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// A page follows a job over one transport and is reloaded three times
// mid-answer: with the upstream held, while it writes, and held again.
// Each life of the page gets the text so far once (restored), then the
// rest; at the end its text is the upstream's byte for byte (characters
// of two UTF-16 units and one split across writes included), every event
// once in order, and the end complete.
func jobTestReloads(t *testing.T, browser context.Context, transport string) {
	j, srv := jobServer(t, Options{SSE: SSEOptions{Retry: browserRetry, HeartbeatInterval: -1}})
	toks := jobtest.Tokens(120)
	g := &jobGate{phases: [][]string{toks[:30], toks[30:70], toks[70:100], toks[100:]}, next: make(chan struct{})}
	prefix := func(i int) string {
		var b strings.Builder
		for _, p := range g.phases[:i] {
			b.WriteString(strings.Join(p, ""))
		}
		return b.String()
	}
	if _, _, err := j.Start(t.Context(), "answer", g.run(2*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	opts, _ := json.Marshal(map[string]any{"sse": "/events", "poll": "/poll", "transport": transport,
		"job": "answer", "storageKey": "job-answer"})
	tab := browserTab(t, browser)
	do := func(f func(context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(tab, browserWait)
		defer cancel()
		if err := f(ctx); err != nil {
			t.Fatal(err)
		}
	}
	do(func(ctx context.Context) error {
		return headless.Navigate(ctx, srv.url()+"/job?opts="+url.QueryEscape(string(opts)))
	})
	has := func(s string) func(jobPageState) bool {
		return func(st jobPageState) bool { return st.text() == s }
	}
	check := func(st jobPageState, after string) {
		t.Helper()
		if len(st.Rec.Texts) == 0 || !st.Rec.Texts[0].Restored || !strings.HasPrefix(st.Rec.Texts[0].Chunk, after) ||
			st.Rec.Texts[0].Chunk == strings.Join(toks, "") {
			t.Fatalf("after a reload the page's first text is not the text so far, restored: %+v", st.Rec.Texts)
		}
		if st.text() != st.Text || len(st.Rec.Gaps) != 0 {
			t.Fatalf("the chunks %q are not followJob's text %q, or gaps %v", st.text(), st.Text, st.Rec.Gaps)
		}
	}

	jobWait(t, tab, "phase 1", has(prefix(1)))
	do(headless.Reload) // the upstream held
	check(jobWait(t, tab, "phase 1 after a reload", has(prefix(1))), prefix(1))
	g.next <- struct{}{}
	jobWait(t, tab, "some of phase 2", func(st jobPageState) bool { return len(st.text()) > len(prefix(1)) })
	do(headless.Reload) // while the upstream writes
	check(jobWait(t, tab, "phase 2 after a reload", has(prefix(2))), prefix(1))
	g.next <- struct{}{}
	jobWait(t, tab, "phase 3", has(prefix(3)))
	do(headless.Reload)
	check(jobWait(t, tab, "phase 3 after a reload", has(prefix(3))), prefix(3))
	g.next <- struct{}{}

	st := jobWait(t, tab, "the end", func(st jobPageState) bool { return len(st.Rec.Ends) > 0 })
	check(st, prefix(3))
	if want := strings.Join(toks, ""); st.text() != want || st.Text != want {
		t.Fatalf("the page's text differs from the upstream's\n got %q\nwant %q", st.text(), want)
	}
	if len(st.Rec.Events) != len(g.phases) {
		t.Fatalf("events %+v, want %d", st.Rec.Events, len(g.phases))
	}
	for i, e := range st.Rec.Events {
		var ev struct {
			Type string
			I    int
		}
		if json.Unmarshal([]byte(e.E), &ev) != nil || e.N != i || ev.Type != "phase" || ev.I != i || e.Restored != (i < 3) {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	if len(st.Rec.Ends) != 1 || st.Rec.Ends[0] != `{"status":"complete","meta":{"phases":4}}` {
		t.Fatalf("ends %v", st.Rec.Ends)
	}
}

// A fresh page on a finished job of more messages than the SSE endpoint
// replays reads the rest over polls: the whole text, no gap.
func jobTestPastReplayLimit(t *testing.T, browser context.Context) {
	j, srv := jobServer(t, Options{SSE: SSEOptions{Retry: browserRetry, HeartbeatInterval: -1, ReplayLimit: 3}})
	toks := jobtest.Tokens(60)
	g := &jobGate{phases: [][]string{toks[:20], toks[20:40], toks[40:]}, next: make(chan struct{}, 2)}
	g.next <- struct{}{}
	g.next <- struct{}{}
	if _, _, err := j.Start(t.Context(), "long", g.run(2*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	waitJob(t, j, "long", JobComplete)
	evs, err := j.h.Replay(t.Context(), j.Topic("long"), 0, 1000)
	if err != nil || len(evs) <= 3+2 {
		t.Fatalf("the job has %d events (%v): not past the replay limit", len(evs), err)
	}
	opts, _ := json.Marshal(map[string]any{"sse": "/events", "poll": "/poll", "job": "long"})
	tab := browserTab(t, browser)
	ctx, cancel := context.WithTimeout(tab, browserWait)
	defer cancel()
	if err := headless.Navigate(ctx, srv.url()+"/job?opts="+url.QueryEscape(string(opts))); err != nil {
		t.Fatal(err)
	}
	st := jobWait(t, tab, "the end", func(st jobPageState) bool { return len(st.Rec.Ends) > 0 })
	if want := strings.Join(toks, ""); st.text() != want || len(st.Rec.Gaps) != 0 || len(st.Rec.Events) != 3 {
		t.Fatalf("text %q, gaps %v, events %+v; want %q, no gap, 3 events", st.text(), st.Rec.Gaps, st.Rec.Events, want)
	}
}
