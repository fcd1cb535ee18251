package hubtest

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

	"github.com/replayd/replayd/internal/jobtest"

	"github.com/replayd/replayd"
)

// RunJobs runs the job-stream subtests (SPEC §20, docs/jobs.md) against
// the hubs newLog makes (as Run does; the hub's store must keep Durable
// Streams): idempotent start on two hubs, the lifecycle (complete, failed,
// panicked), abandonment, retention then not found, a lease taken over
// (interrupted), and reads from any offset. Each subtest takes about a
// second at most (short leases, retentions and abandonment times). The
// backend's own tests of job streams in separate OS processes are
// RunJobsProcesses's.
func RunJobs(t *testing.T, newLog func(t *testing.T) (open func(opts replayd.Options) *replayd.EventHub)) {
	for _, st := range jobsSubtests {
		t.Run(st.name, func(t *testing.T) { st.fn(t, newLog(t)) })
	}
}

var jobsSubtests = []struct {
	name string
	fn   func(t *testing.T, open opener)
}{
	{"IdempotentStartTwoHubs", testJobsIdempotentStartTwoHubs},
	{"Lifecycle", testJobsLifecycle},
	{"Abandoned", testJobsAbandoned},
	{"Retention", testJobsRetention},
	{"LeaseTakeover", testJobsLeaseTakeover},
	{"ReadFromOffsets", testJobsReadFromOffsets},
}

// openJobs opens a hub with open and its Jobs with opts.
func openJobs(t testing.TB, open opener, opts replayd.JobsOptions) (*replayd.EventHub, *replayd.Jobs) {
	t.Helper()
	h := open(replayd.Options{})
	j, err := h.Jobs(opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, j
}

// waitJob polls j.Get until job id has status want (bounded); it fails on
// any other end.
func waitJob(t testing.TB, j *replayd.Jobs, id string, want replayd.JobStatus) replayd.JobInfo {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		in, err := j.Get(context.Background(), id)
		if err != nil {
			t.Fatalf("job %s: %v", id, err)
		}
		if in.Status == want {
			return in
		}
		if in.Status != replayd.JobStreaming {
			t.Fatalf("job %s ended %s (%+v), want %s", id, in.Status, in.Err, want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %s, want %s", id, in.Status, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two hubs on one log race starts of one id, four goroutines each: the
// upstream runs once per id, exactly one Start says started, and every
// Start returns the same job (its creation time).
func testJobsIdempotentStartTwoHubs(t *testing.T, open opener) {
	_, a := openJobs(t, open, replayd.JobsOptions{})
	_, b := openJobs(t, open, replayd.JobsOptions{})
	var runs atomic.Int64
	release := make(chan struct{})
	up := func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		runs.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		w.WriteString("done")
		return nil, nil
	}
	const ids = 10
	for round := range ids {
		id := fmt.Sprintf("race-%d", round)
		var wg sync.WaitGroup
		var started atomic.Int64
		created := make([]time.Time, 8)
		for i := range created {
			j := a
			if i%2 == 1 {
				j = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				in, ok, err := j.Start(context.Background(), id, up)
				if err != nil {
					t.Error(err)
				}
				if ok {
					started.Add(1)
				}
				created[i] = in.Created
			}()
		}
		wg.Wait()
		if started.Load() != 1 {
			t.Fatalf("%s: %d starts ran", id, started.Load())
		}
		for _, c := range created {
			if !c.Equal(created[0]) || c.IsZero() {
				t.Fatalf("%s: starts returned jobs created at %v", id, created)
			}
		}
	}
	close(release)
	for round := range ids {
		waitJob(t, a, fmt.Sprintf("race-%d", round), replayd.JobComplete)
	}
	if runs.Load() != ids {
		t.Fatalf("the upstream ran %d times for %d ids", runs.Load(), ids)
	}
}

// A job's lifecycle: complete with its text, events, progress and final
// metadata; an upstream that returns an error ends error failed with its
// message; one that panics ends error panicked, and the node goes on.
func testJobsLifecycle(t *testing.T, open opener) {
	_, j := openJobs(t, open, replayd.JobsOptions{Linger: 5 * time.Millisecond})
	toks := jobtest.Tokens(40)
	want := strings.Join(toks, "")
	in, started, err := j.Start(context.Background(), "answer", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		if err := w.Progress(replayd.JobProgress{Phase: "generation", Message: "writing"}); err != nil {
			return nil, err
		}
		for i, tok := range toks {
			if i%10 == 0 {
				if err := w.Emit(map[string]any{"type": "tick", "i": i}); err != nil {
					return nil, err
				}
			}
			if _, err := w.WriteString(tok); err != nil {
				return nil, err
			}
		}
		return map[string]any{"tokens": len(toks)}, nil
	})
	if err != nil || !started || in.Status != replayd.JobStreaming || in.ID != "answer" || in.Created.IsZero() {
		t.Fatalf("start: %+v %v %v", in, started, err)
	}
	done := waitJob(t, j, "answer", replayd.JobComplete)
	if done.Completed.IsZero() || done.Err != nil || string(done.Meta) != fmt.Sprintf(`{"tokens":%d}`, len(toks)) ||
		done.TextLen != jobtest.Len16(want) || done.Events != int64((len(toks)+9)/10) || !done.Created.Equal(in.Created) {
		t.Fatalf("complete: %+v", done)
	}
	var pr struct {
		Phase     string `json:"phase"`
		UpdatedAt int64  `json:"updated_at"`
	}
	if err := json.Unmarshal(done.Progress, &pr); err != nil || pr.Phase != "generation" || pr.UpdatedAt == 0 {
		t.Fatalf("progress %s: %v", done.Progress, err)
	}
	p, err := j.Read(context.Background(), "answer", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.Append != want || p.NextOffset != jobtest.Len16(want) || int64(len(p.Events)) != done.Events || p.Status != replayd.JobComplete {
		t.Fatalf("read: %q (%d), %d events, %s; want %q", p.Append, p.NextOffset, len(p.Events), p.Status, want)
	}
	var ev map[string]any
	if err := json.Unmarshal(p.Events[1], &ev); err != nil || ev["i"] != 10.0 || ev["timestamp"] == nil {
		t.Fatalf("event %s: %v", p.Events[1], err)
	}

	if _, _, err := j.Start(context.Background(), "fails", func(context.Context, *replayd.JobWriter) (any, error) {
		return nil, errors.New("upstream broke")
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := j.Start(context.Background(), "panics", func(_ context.Context, w *replayd.JobWriter) (any, error) {
		w.WriteString("before the panic")
		panic("boom")
	}); err != nil {
		t.Fatal(err)
	}
	if in := waitJob(t, j, "fails", replayd.JobError); in.Err == nil || in.Err.Code != replayd.JobFailed || in.Err.Message != "upstream broke" {
		t.Fatalf("failed: %+v", in.Err)
	}
	in = waitJob(t, j, "panics", replayd.JobError)
	if in.Err == nil || in.Err.Code != replayd.JobPanicked || !strings.Contains(in.Err.Message, "boom") {
		t.Fatalf("panicked: %+v", in.Err)
	}
	if p, err := j.Read(context.Background(), "panics", 0, 0); err != nil || p.Append != "before the panic" {
		t.Fatalf("read of the panicked job: %+v %v", p, err)
	}
	// A start of an ended job's id returns it and runs nothing.
	again, ok, err := j.Start(context.Background(), "answer", func(context.Context, *replayd.JobWriter) (any, error) {
		t.Error("an ended job's upstream ran again")
		return nil, nil
	})
	if ok || err != nil || again.Status != replayd.JobComplete || !again.Created.Equal(done.Created) {
		t.Fatalf("start of an ended job: %+v %v %v", again, ok, err)
	}
	if _, err := j.Get(context.Background(), "no-such-job"); !errors.Is(err, replayd.ErrJobNotFound) {
		t.Fatalf("Get of an unknown id: %v", err)
	}
}

// Nobody reads: the job ends error abandoned and its context is
// cancelled; one read (Jobs.Read) every 50 ms keeps another alive for
// several AbandonAfter.
func testJobsAbandoned(t *testing.T, open opener) {
	_, j := openJobs(t, open, replayd.JobsOptions{AbandonAfter: 300 * time.Millisecond, Lease: 150 * time.Millisecond})
	cancelled := make(chan struct{})
	if _, _, err := j.Start(context.Background(), "lonely", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cancelled:
	case <-time.After(waitFor):
		t.Fatal("the abandoned job's context was not cancelled")
	}
	if in := waitJob(t, j, "lonely", replayd.JobError); in.Err == nil || in.Err.Code != replayd.JobAbandoned {
		t.Fatalf("abandoned job: %+v", in)
	}
	stop := make(chan struct{})
	if _, _, err := j.Start(context.Background(), "read", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		select {
		case <-stop:
			return "ok", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		p, err := j.Read(context.Background(), "read", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if p.Status != replayd.JobStreaming {
			t.Fatalf("a job read every 50 ms ended %s (%+v)", p.Status, p.Err)
		}
	}
	close(stop)
	waitJob(t, j, "read", replayd.JobComplete)
}

// A finished job is kept for Retention, then not found, to Get, Read and
// the relay handler (status not_found), on the hub that ran it and on
// another; its id can then be started again.
func testJobsRetention(t *testing.T, open opener) {
	opts := replayd.JobsOptions{Retention: 300 * time.Millisecond}
	_, j := openJobs(t, open, opts)
	_, other := openJobs(t, open, opts)
	srv := httptest.NewServer(other.RelayHandler(replayd.JobsRelayOptions{Prefix: "/",
		Upstream: func(*http.Request, json.RawMessage) replayd.JobFunc { return nil }}))
	defer srv.Close()
	if _, _, err := j.Start(context.Background(), "kept", func(_ context.Context, w *replayd.JobWriter) (any, error) {
		w.WriteString("the answer")
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitJob(t, j, "kept", replayd.JobComplete)
	if p, err := other.Read(context.Background(), "kept", 0, 0); err != nil || p.Append != "the answer" {
		t.Fatalf("read within the retention: %+v %v", p, err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		_, err := j.Get(context.Background(), "kept")
		if errors.Is(err, replayd.ErrJobNotFound) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("after the retention: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := other.Read(context.Background(), "kept", 0, 0); !errors.Is(err, replayd.ErrJobNotFound) {
		t.Fatalf("Read after the retention: %v", err)
	}
	resp, err := http.Get(srv.URL + "/streams/kept?since=0&eventSince=0")
	if err != nil {
		t.Fatal(err)
	}
	var nf struct {
		Status string `json:"status"`
	}
	err = json.NewDecoder(resp.Body).Decode(&nf)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || nf.Status != "not_found" {
		t.Fatalf("relay after the retention: %d %+v %v", resp.StatusCode, nf, err)
	}
	if _, ok, err := other.Start(context.Background(), "kept", func(_ context.Context, w *replayd.JobWriter) (any, error) {
		w.WriteString("again")
		return nil, nil
	}); !ok || err != nil {
		t.Fatalf("start after the deletion: %v %v", ok, err)
	}
	waitJob(t, other, "kept", replayd.JobComplete)
	if p, err := j.Read(context.Background(), "kept", 0, 0); err != nil || p.Append != "again" {
		t.Fatalf("the job started again: %+v %v", p, err)
	}
}

// A hub closed mid-run (as a node that died: nothing more is written)
// leaves the job streaming until its lease lapses; then another hub's
// read ends it error interrupted, with the text committed before, and a
// start of its id runs nothing.
func testJobsLeaseTakeover(t *testing.T, open opener) {
	opts := replayd.JobsOptions{Lease: 300 * time.Millisecond}
	ha, a := openJobs(t, open, opts)
	_, b := openJobs(t, open, opts)
	wrote := make(chan struct{})
	if _, _, err := a.Start(context.Background(), "dies", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		w.WriteString("partial answer")
		close(wrote)
		<-ctx.Done()
		return nil, ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	<-wrote
	deadline := time.Now().Add(waitFor)
	for {
		p, err := b.Read(context.Background(), "dies", 0, 0)
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
	ha.Close()
	if in, err := b.Get(context.Background(), "dies"); err != nil || in.Status != replayd.JobStreaming {
		t.Fatalf("right after the node stopped: %+v %v", in, err)
	}
	in := waitJob(t, b, "dies", replayd.JobError)
	if in.Err == nil || in.Err.Code != replayd.JobInterrupted {
		t.Fatalf("after the lease: %+v", in)
	}
	p, err := b.Read(context.Background(), "dies", 0, 0)
	if err != nil || p.Append != "partial answer" || p.Status != replayd.JobError {
		t.Fatalf("read after the takeover: %+v %v", p, err)
	}
	if _, ok, err := b.Start(context.Background(), "dies", func(context.Context, *replayd.JobWriter) (any, error) {
		t.Error("ran again")
		return nil, nil
	}); ok || err != nil {
		t.Fatalf("start after the takeover: %v %v", ok, err)
	}
}

// Reads from any text offset (UTF-16 code units) and event offset: while
// the job streams, a reader that goes on from each read's next offsets
// gets the text and the events exactly once; once it ended, every offset
// reads the rest, an offset inside a surrogate pair starts at the pair,
// offsets past the end are clamped, and another hub reads the same.
func testJobsReadFromOffsets(t *testing.T, open opener) {
	opts := replayd.JobsOptions{Linger: 5 * time.Millisecond}
	_, j := openJobs(t, open, opts)
	_, other := openJobs(t, open, opts)
	toks := jobtest.Tokens(120)
	want := strings.Join(toks, "")
	var events []string
	for i := range toks {
		if i%10 == 0 {
			events = append(events, fmt.Sprintf(`{"i":%d,"timestamp":1}`, i))
		}
	}
	if _, _, err := j.Start(context.Background(), "offsets", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		for i, tok := range toks {
			if i%10 == 0 {
				if err := w.Emit(json.RawMessage(events[i/10])); err != nil {
					return nil, err
				}
			}
			if _, err := w.WriteString(tok); err != nil {
				return nil, err
			}
			time.Sleep(time.Millisecond)
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	var got []string
	var off, evOff int64
	deadline := time.Now().Add(waitFor)
	for {
		p, err := other.Read(context.Background(), "offsets", off, evOff)
		if err != nil {
			t.Fatal(err)
		}
		if p.NextOffset != off+jobtest.Len16(p.Append) || p.NextEventOffset != evOff+int64(len(p.Events)) {
			t.Fatalf("read from %d/%d: %d units of text, %d events, next %d/%d", off, evOff,
				jobtest.Len16(p.Append), len(p.Events), p.NextOffset, p.NextEventOffset)
		}
		text.WriteString(p.Append)
		for _, e := range p.Events {
			got = append(got, string(e))
		}
		off, evOff = p.NextOffset, p.NextEventOffset
		if p.Status != replayd.JobStreaming {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job did not end")
		}
		time.Sleep(3 * time.Millisecond)
	}
	if text.String() != want || strings.Join(got, ",") != strings.Join(events, ",") {
		t.Fatalf("followed by offsets:\n%q\n%v\nwant\n%q\n%v", text.String(), got, want, events)
	}
	total := jobtest.Len16(want)
	for _, r := range []*replayd.Jobs{j, other} {
		for _, since := range []int64{0, 1, 17, 18, 19, total / 2, total - 1, total, total + 5, 1 << 40, -3} {
			for _, evSince := range []int64{0, 3, int64(len(events)), 1 << 40} {
				p, err := r.Read(context.Background(), "offsets", since, evSince)
				if err != nil {
					t.Fatal(err)
				}
				wantEv := events[min(max(evSince, 0), int64(len(events))):]
				if p.Append != jobtest.From16(want, max(since, 0)) || p.NextOffset != total ||
					p.NextEventOffset != int64(len(events)) || len(p.Events) != len(wantEv) {
					t.Fatalf("read from %d/%d: %q next %d/%d, %d events; want %q", since, evSince,
						p.Append, p.NextOffset, p.NextEventOffset, len(p.Events), jobtest.From16(want, max(since, 0)))
				}
				for k, e := range p.Events {
					if string(e) != wantEv[k] {
						t.Fatalf("read from %d/%d: event %d %s, want %s", since, evSince, k, e, wantEv[k])
					}
				}
			}
		}
	}
	// The first astral character: an offset at its second unit reads from it.
	i := strings.Index(want, "😀")
	at := jobtest.Len16(want[:i])
	if p, _ := j.Read(context.Background(), "offsets", at+1, 0); p == nil || !strings.HasPrefix(p.Append, "😀") {
		t.Fatalf("read from inside a surrogate pair: %+v", p)
	}
	if _, err := j.Read(context.Background(), "no-such-job", 0, 0); !errors.Is(err, replayd.ErrJobNotFound) {
		t.Fatalf("Read of an unknown id: %v", err)
	}
}
