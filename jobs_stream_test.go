package replayd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/jobtest"
)

// Job streams (SPEC §20) over real parts: hubs on a SQLite file in
// t.TempDir(), the relay handler over real HTTP.

type jobsEnv struct {
	h    *EventHub
	j    *Jobs
	path string
	url  string
}

// llm writes toks, one per write, every gap; it emits an event every 10
// tokens and reports progress.
func llm(toks []string, gap time.Duration) JobFunc {
	return func(ctx context.Context, w *JobWriter) (any, error) {
		w.Progress(JobProgress{Phase: "generation", Message: "writing"})
		for i, tok := range toks {
			if i%10 == 0 {
				if err := w.Emit(map[string]any{"type": "tick", "i": i}); err != nil {
					return nil, err
				}
			}
			if _, err := w.WriteString(tok); err != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(gap):
			}
		}
		return map[string]any{"tokens": len(toks)}, nil
	}
}

func newJobsEnvAt(t *testing.T, path string, opts JobsOptions, up func(json.RawMessage) JobFunc) *jobsEnv {
	t.Helper()
	h := secondHub(t, path, Options{})
	j, err := h.Jobs(opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/relay/", j.RelayHandler(JobsRelayOptions{Prefix: "/relay/",
		Upstream: func(r *http.Request, payload json.RawMessage) JobFunc { return up(payload) }}))
	mux.Handle("/v1/stream/", h.DurableStreams(DurableStreamsOptions{Open: true}))
	mux.Handle("/poll", h.PollHandler())
	mux.Handle("/events", h.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &jobsEnv{h: h, j: j, path: path, url: srv.URL}
}

func newJobsEnv(t *testing.T, opts JobsOptions, up func(json.RawMessage) JobFunc) *jobsEnv {
	t.Helper()
	_, path := openTestDB(t)
	return newJobsEnvAt(t, path, opts, up)
}

func (e *jobsEnv) client(t testing.TB) relayClient { return relayClient{t: t, base: e.url + "/relay"} }

// follow polls id to its end (bounded), every gap.
func follow(t *testing.T, c relayClient, id string, f *follower, gap time.Duration) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f.done() {
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not end: %+v", id, f.last)
		}
		if err := f.step(t.Context(), c, id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap) // the client's poll cadence
	}
}

func TestJobsRelayEndToEnd(t *testing.T) {
	toks := jobtest.Tokens(60)
	want := strings.Join(toks, "")
	e := newJobsEnv(t, JobsOptions{}, func(json.RawMessage) JobFunc { return llm(toks, time.Millisecond) })
	c := e.client(t)
	st := c.start(t.Context(), "", map[string]any{"prompt": "hi"})
	f := &follower{}
	follow(t, c, st.StreamID, f, 20*time.Millisecond)
	a := f.last
	if a.Status != "complete" || !a.Complete || a.CompletedAt == nil || a.Final == nil {
		t.Fatalf("end: %+v", a)
	}
	if f.text != want || a.Final.Text != want {
		t.Fatalf("text %q, final %q, want %q", f.text, a.Final.Text, want)
	}
	nev := (len(toks) + 9) / 10
	if len(f.events) != nev || len(a.Final.Events) != nev || string(a.Final.Meta) != `{"tokens":`+fmt.Sprint(len(toks))+`}` {
		t.Fatalf("events %d, final events %d, meta %s", len(f.events), len(a.Final.Events), a.Final.Meta)
	}
	var ev map[string]any
	json.Unmarshal(f.events[1], &ev)
	if ev["i"] != 10.0 || ev["timestamp"] == nil {
		t.Fatalf("event %s", f.events[1])
	}
	if a.Progress == nil || a.Progress.Phase != "generation" || a.Progress.UpdatedAt == 0 {
		t.Fatalf("progress %+v", a.Progress)
	}
	if a.ServerNow < a.LastEventAt || a.LastEventAt == 0 {
		t.Fatalf("lastEventAt %d serverNow %d", a.LastEventAt, a.ServerNow)
	}
	// A start of the same id returns it and runs nothing.
	again := c.start(t.Context(), st.StreamID, nil)
	if again.StreamID != st.StreamID || again.StartedAt != st.StartedAt {
		t.Fatalf("second start %+v, first %+v", again, st)
	}
	// Out-of-range offsets are clamped; from the middle only the rest.
	mid := &follower{offset: 10, evOffset: 4}
	if err := mid.step(t.Context(), c, st.StreamID); err != nil {
		t.Fatal(err)
	}
	if mid.text != jobtest.From16(want, 10) || len(mid.events) != nev-4 {
		t.Fatalf("from 10/4: %q, %d events", mid.text, len(mid.events))
	}
	over, _ := c.poll(t.Context(), st.StreamID, 1<<40, 1<<40)
	if over.Append != "" || over.NextOffset != a.NextOffset || over.NextEventOffset != int64(nev) {
		t.Fatalf("clamped: %+v", over)
	}
	nf, _ := c.poll(t.Context(), "no-such-job", 0, 0)
	if nf.Status != "not_found" || nf.Complete {
		t.Fatalf("unknown id: %+v", nf)
	}
}

// The document's reload chaos: read 50 ms, pause 40 ms, five times, then
// to the end; each reload starts a new follower from the persisted
// offsets. The text is byte for byte the upstream's.
func TestJobsRelayReloadChaos(t *testing.T) {
	toks := jobtest.Tokens(200)
	want := strings.Join(toks, "")
	e := newJobsEnv(t, JobsOptions{}, func(json.RawMessage) JobFunc { return llm(toks, 2*time.Millisecond) })
	c := e.client(t)
	id := c.start(t.Context(), "chaos-1", nil).StreamID
	var text string
	var off, evOff int64
	var events int
	for range 5 {
		f := &follower{offset: off, evOffset: evOff}
		end := time.Now().Add(50 * time.Millisecond)
		for time.Now().Before(end) && !f.done() {
			ctx, cancel := context.WithDeadline(t.Context(), end)
			err := f.step(ctx, c, id)
			cancel()
			if err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		text, off, evOff, events = text+f.text, f.offset, f.evOffset, events+len(f.events)
		time.Sleep(40 * time.Millisecond) // the page is gone
	}
	f := &follower{offset: off, evOffset: evOff}
	follow(t, c, id, f, 10*time.Millisecond)
	text += f.text
	events += len(f.events)
	if text != want {
		t.Fatalf("text after reloads:\n%q\nwant\n%q", text, want)
	}
	if events != (len(toks)+9)/10 || f.last.Status != "complete" {
		t.Fatalf("%d events, status %s", events, f.last.Status)
	}
}

func waitJob(t *testing.T, j *Jobs, id string, want JobStatus) JobInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := j.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if in.Status == want {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %s, want %s", id, in.Status, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
