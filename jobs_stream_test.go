package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Job streams (SPEC §20) over real parts: hubs on a SQLite file in
// t.TempDir(), the relay handler over real HTTP.

type jobsEnv struct {
	h    *EventHub
	j    *Jobs
	path string
	url  string
}

// tokens is an LLM-like answer: ASCII, accents, an astral character (two
// UTF-16 units) and one split across writes mid-character.
func tokens(n int) []string {
	out := make([]string, 0, n)
	for i := range n {
		switch i % 7 {
		case 3:
			out = append(out, " café")
		case 5:
			out = append(out, " 😀")
		case 6:
			out = append(out, "\xe2\x82", "\xac") // € split mid-character
		default:
			out = append(out, fmt.Sprintf(" tok%d", i))
		}
	}
	return out
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
	toks := tokens(60)
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
	if mid.text != want[10:] || len(mid.events) != nev-4 {
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
	toks := tokens(200)
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

// Two hubs on one SQLite file race starts of one id: the upstream runs
// once.
func TestJobsIdempotentStartTwoHubs(t *testing.T) {
	_, path := openTestDB(t)
	var runs atomic.Int64
	release := make(chan struct{})
	up := func(ctx context.Context, w *JobWriter) (any, error) {
		runs.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		w.WriteString("done")
		return nil, nil
	}
	a := newJobsEnvAt(t, path, JobsOptions{}, nil)
	b := newJobsEnvAt(t, path, JobsOptions{}, nil)
	for round := range 10 {
		id := fmt.Sprintf("race-%d", round)
		var wg sync.WaitGroup
		var started atomic.Int64
		for i := range 8 {
			j := a.j
			if i%2 == 1 {
				j = b.j
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, ok, err := j.Start(t.Context(), id, up)
				if err != nil {
					t.Error(err)
				}
				if ok {
					started.Add(1)
				}
			}()
		}
		wg.Wait()
		if started.Load() != 1 {
			t.Fatalf("%s: %d starts ran", id, started.Load())
		}
	}
	close(release)
	if runs.Load() != 10 {
		t.Fatalf("the upstream ran %d times for 10 ids", runs.Load())
	}
	waitJob(t, a.j, "race-9", JobComplete)
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

// Nobody reads: the job ends error abandoned and its context is
// cancelled; a reader keeps another alive.
func TestJobsAbandoned(t *testing.T) {
	e := newJobsEnv(t, JobsOptions{AbandonAfter: 300 * time.Millisecond, Lease: 150 * time.Millisecond}, nil)
	cancelled := make(chan struct{})
	up := func(ctx context.Context, w *JobWriter) (any, error) {
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}
	if _, _, err := e.j.Start(t.Context(), "lonely", up); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the abandoned job's context was not cancelled")
	}
	in := waitJob(t, e.j, "lonely", JobError)
	if in.Err == nil || in.Err.Code != JobAbandoned {
		t.Fatalf("abandoned job: %+v", in)
	}
	// Read every 50 ms for a second: not abandoned.
	stop := make(chan struct{})
	kept := func(ctx context.Context, w *JobWriter) (any, error) {
		select {
		case <-stop:
			return "ok", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if _, _, err := e.j.Start(t.Context(), "read", kept); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, err := e.j.Read(t.Context(), "read", 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	waitJob(t, e.j, "read", JobComplete)
}

// A hub closed mid-run (as a node that died: nothing more is written)
// leaves the job streaming until its lease lapses; then another hub's
// read ends it error interrupted, with the text committed before.
func TestJobsLeaseTakeover(t *testing.T) {
	_, path := openTestDB(t)
	opts := JobsOptions{Lease: 300 * time.Millisecond}
	a := newJobsEnvAt(t, path, opts, nil)
	b := newJobsEnvAt(t, path, opts, nil)
	wrote := make(chan struct{})
	up := func(ctx context.Context, w *JobWriter) (any, error) {
		w.WriteString("partial answer")
		close(wrote)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if _, _, err := a.j.Start(t.Context(), "dies", up); err != nil {
		t.Fatal(err)
	}
	<-wrote
	// The text is committed within a linger.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := b.j.Read(t.Context(), "dies", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if p.Append == "partial answer" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("text not committed: %+v", p)
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.h.Close()
	if in, _ := b.j.Get(t.Context(), "dies"); in.Status != JobStreaming {
		t.Fatalf("right after the node stopped: %s", in.Status)
	}
	in := waitJob(t, b.j, "dies", JobError)
	if in.Err == nil || in.Err.Code != JobInterrupted {
		t.Fatalf("after the lease: %+v", in)
	}
	p, err := b.j.Read(t.Context(), "dies", 0, 0)
	if err != nil || p.Append != "partial answer" {
		t.Fatalf("read after takeover: %+v %v", p, err)
	}
	// A start of the id returns the ended job and runs nothing.
	if _, ok, err := b.j.Start(t.Context(), "dies", func(context.Context, *JobWriter) (any, error) {
		t.Error("ran again")
		return nil, nil
	}); ok || err != nil {
		t.Fatalf("start after takeover: %v %v", ok, err)
	}
}

// A finished job is kept for Retention, then not found; a failed and a
// panicking upstream end error.
func TestJobsRetentionAndErrors(t *testing.T) {
	e := newJobsEnv(t, JobsOptions{Retention: 400 * time.Millisecond}, nil)
	if _, _, err := e.j.Start(t.Context(), "fails", func(context.Context, *JobWriter) (any, error) {
		return nil, errors.New("upstream broke")
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.j.Start(t.Context(), "panics", func(context.Context, *JobWriter) (any, error) {
		panic("boom")
	}); err != nil {
		t.Fatal(err)
	}
	if in := waitJob(t, e.j, "fails", JobError); in.Err.Code != JobFailed || in.Err.Message != "upstream broke" {
		t.Fatalf("failed: %+v", in.Err)
	}
	if in := waitJob(t, e.j, "panics", JobError); in.Err.Code != JobPanicked {
		t.Fatalf("panicked: %+v", in.Err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.j.Get(t.Context(), "fails")
		if errors.Is(err, ErrJobNotFound) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("after retention: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	nf, _ := e.client(t).poll(t.Context(), "fails", 0, 0)
	if nf.Status != "not_found" {
		t.Fatalf("relay after retention: %+v", nf)
	}
	// The id can be started again.
	if _, ok, err := e.j.Start(t.Context(), "fails", func(context.Context, *JobWriter) (any, error) { return nil, nil }); !ok || err != nil {
		t.Fatalf("restart after deletion: %v %v", ok, err)
	}
	waitJob(t, e.j, "fails", JobComplete)
}
