package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/jobtest"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
)

// jobServer is a server (helpers_test.go) whose hub runs jobs.
type jobServer struct {
	*server
	jobs *replayd.Jobs
}

func newJobServer(t *testing.T, opts replayd.Options, jopts replayd.JobsOptions) *jobServer {
	t.Helper()
	s := newServer(t, opts)
	if jopts.Linger == 0 {
		jopts.Linger = 2 * time.Millisecond // many commits: many messages to resume between
	}
	j, err := s.hub.Load().Jobs(jopts)
	if err != nil {
		t.Fatal(err)
	}
	return &jobServer{server: s, jobs: j}
}

// start starts job id running fn.
func (s *jobServer) start(t *testing.T, id string, fn replayd.JobFunc) {
	t.Helper()
	if _, started, err := s.jobs.Start(context.Background(), id, fn); err != nil || !started {
		t.Fatalf("start %s: started %v, %v", id, started, err)
	}
}

// upstream is a job that writes toks, an event every 10 of them, and
// progress, then returns its metadata. Before token hold (if any) it
// waits for release: the test decides when the rest is written.
type upstream struct {
	toks    []string
	hold    int
	release chan struct{}
}

func newUpstream(n, hold int) *upstream {
	return &upstream{toks: jobtest.Tokens(n), hold: hold, release: make(chan struct{})}
}

func (u *upstream) text() string { return strings.Join(u.toks, "") }
func (u *upstream) events() int  { return (len(u.toks) + 9) / 10 }

func (u *upstream) run(ctx context.Context, w *replayd.JobWriter) (any, error) {
	w.Progress(replayd.JobProgress{Phase: "retrieval", Message: "searching"})
	for i, tok := range u.toks {
		if i == u.hold && u.hold > 0 {
			select {
			case <-u.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			w.Progress(replayd.JobProgress{Phase: "generation", Message: "writing"})
		}
		if i%10 == 0 {
			if err := w.Emit(map[string]any{"type": "tick", "i": i}); err != nil {
				return nil, err
			}
		}
		if _, err := w.WriteString(tok); err != nil {
			return nil, err
		}
	}
	return map[string]any{"tokens": len(u.toks)}, nil
}

// jobRecorder keeps what a Job's handler was handed and checks, as it
// goes, that text comes in order with nothing twice and events each once
// in order: violations are kept in err.
type jobRecorder struct {
	mu      sync.Mutex
	updates []client.JobUpdate
	text    strings.Builder
	next    int64 // the UTF-16 offset the next chunk must start at
	events  int64 // the next event number
	err     error
	changed chan struct{} // closed and replaced on every update
	refuse  func(client.JobUpdate) error
}

func newJobRecorder(from client.JobState) *jobRecorder {
	r := &jobRecorder{changed: make(chan struct{}), next: from.Next, events: int64(len(from.Events))}
	r.text.WriteString(from.Text)
	return r
}

func (r *jobRecorder) handle(u client.JobUpdate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse != nil {
		if err := r.refuse(u); err != nil {
			return err
		}
	}
	fail := func(format string, args ...any) {
		if r.err == nil {
			r.err = fmt.Errorf(format, args...)
		}
	}
	switch {
	case u.Text != nil:
		if u.Text.Offset != r.next || u.Text.Chunk == "" {
			fail("chunk %q at %d, want at %d", u.Text.Chunk, u.Text.Offset, r.next)
		}
		r.text.WriteString(u.Text.Chunk)
		r.next = u.Text.Offset + jobtest.Len16(u.Text.Chunk)
	case u.Event != nil:
		if u.Event.N != r.events {
			fail("event %d, want %d", u.Event.N, r.events)
		}
		r.events = u.Event.N + 1
	case u.Gap != nil:
		fail("gap %+v", *u.Gap)
	}
	r.updates = append(r.updates, u)
	close(r.changed)
	r.changed = make(chan struct{})
	return nil
}

// waitText waits until at least n UTF-16 units of text were handed.
func (r *jobRecorder) waitText(t *testing.T, n int64) {
	t.Helper()
	timer := time.NewTimer(wiretest.WaitFor)
	defer timer.Stop()
	for {
		r.mu.Lock()
		done, ch := r.next >= n, r.changed
		r.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("timed out waiting for %d units of text; have %d", n, r.next)
		}
	}
}

func (r *jobRecorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		t.Fatal(r.err)
	}
}

// follow runs job in a goroutine; wait returns Run's answer, failing the
// test if it does not come within wiretest.WaitFor.
func follow(t *testing.T, ctx context.Context, job *client.Job, handle func(client.JobUpdate) error) (wait func() (*client.JobEnd, error)) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	type result struct {
		end *client.JobEnd
		err error
	}
	done := make(chan result, 1)
	go func() {
		end, err := job.Run(ctx, handle)
		done <- result{end, err}
	}()
	var once sync.Once
	var res result
	wait = func() (*client.JobEnd, error) {
		t.Helper()
		once.Do(func() {
			defer cancel()
			select {
			case res = <-done:
			case <-time.After(wiretest.WaitFor):
				cancel()
				select {
				case res = <-done:
				case <-time.After(wiretest.WaitFor):
				}
				res.err = fmt.Errorf("Run did not end within %v (then: %v)", wiretest.WaitFor, res.err)
			}
		})
		return res.end, res.err
	}
	t.Cleanup(func() { cancel(); wait() })
	return wait
}

// checkComplete checks that the follower ended complete with the
// upstream's text byte for byte, every event once in order, the last
// progress, and the metadata.
func checkComplete(t *testing.T, u *upstream, j *client.Job, end *client.JobEnd, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if end == nil || end.Status != "complete" || end.Err() != nil || string(end.Meta) != fmt.Sprintf(`{"tokens":%d}`, len(u.toks)) {
		t.Fatalf("end %+v, want complete with the metadata", end)
	}
	st := j.State()
	if st.Text != u.text() || j.Text() != u.text() || st.Next != jobtest.Len16(u.text()) {
		t.Fatalf("text (%d units, next %d) differs from the upstream's (%d units):\n got %q\nwant %q",
			jobtest.Len16(st.Text), st.Next, jobtest.Len16(u.text()), st.Text, u.text())
	}
	if len(st.Events) != u.events() || len(st.Gaps) != 0 || st.End == nil {
		t.Fatalf("state: %d events (want %d), gaps %+v, end %+v", len(st.Events), u.events(), st.Gaps, st.End)
	}
	for n, e := range st.Events {
		var ev struct {
			Type string `json:"type"`
			I    int    `json:"i"`
		}
		if json.Unmarshal(e, &ev) != nil || ev.Type != "tick" || ev.I != 10*n {
			t.Fatalf("event %d: %s", n, e)
		}
	}
	var pr struct{ Phase string }
	if json.Unmarshal(st.Progress, &pr) != nil || (u.hold > 0 && pr.Phase != "generation") {
		t.Fatalf("progress %s", st.Progress)
	}
}

// A job followed from its start over each transport, live: the text is
// the upstream's byte for byte (characters of two UTF-16 units, split
// across writes), handed in order with nothing twice; every event once
// in order; the latest progress; the end complete with the metadata;
// the updates handed and the state agree.
func TestJobFollowsToTheEnd(t *testing.T) {
	for _, tr := range []client.Transport{client.SSE, client.Poll, client.Auto} {
		t.Run(string(tr), func(t *testing.T) {
			s := newJobServer(t, replayd.Options{}, replayd.JobsOptions{})
			u := newUpstream(120, 40)
			s.start(t, "run", u.run)
			job := client.NewJob(client.JobOptions{Options: s.options(tr), Job: "run"})
			if job.Topic() != "jobs/run" {
				t.Fatalf("topic %q", job.Topic())
			}
			r := newJobRecorder(client.JobState{})
			var inHandler error // the state seen from the handler, if it lacks the update
			wait := follow(t, t.Context(), job, func(up client.JobUpdate) error {
				st := job.State()
				switch {
				case up.Text != nil && (st.Next != up.Text.Offset+jobtest.Len16(up.Text.Chunk) || !strings.HasSuffix(st.Text, up.Text.Chunk)),
					up.Event != nil && int64(len(st.Events)) != up.Event.N+1,
					up.End != nil && st.End == nil:
					if inHandler == nil {
						inHandler = fmt.Errorf("update %+v: the state in the handler lacks it: %+v", up, st)
					}
				}
				return r.handle(up)
			})
			r.waitText(t, 20) // live: the upstream is held
			close(u.release)
			end, err := wait()
			checkComplete(t, u, job, end, err)
			r.check(t)
			if inHandler != nil {
				t.Fatal(inHandler)
			}
			if r.text.String() != u.text() || r.events != int64(u.events()) {
				t.Fatalf("handed %q and %d events", r.text.String(), r.events)
			}
			if last := r.updates[len(r.updates)-1]; last.End == nil || last.End.Status != "complete" {
				t.Fatalf("last update %+v, want the end", last)
			}
			var progress []string
			for _, up := range r.updates {
				if up.Progress != nil {
					progress = append(progress, string(up.Progress))
				}
			}
			if len(progress) != 2 || !strings.Contains(progress[0], "retrieval") || !strings.Contains(progress[1], "generation") {
				t.Fatalf("progress updates %q", progress)
			}
		})
	}
}

// Connections cut mid-answer, at random bytes (mid-frame, mid-header,
// mid-poll answer) by a proxy, and every client connection closed by the
// server now and then: the follower reconnects from its cursor and ends
// with the upstream's text exactly, every event once.
func TestJobSurvivesDroppedConnections(t *testing.T) {
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		t.Run(string(tr), func(t *testing.T) {
			s := newJobServer(t, replayd.Options{}, replayd.JobsOptions{})
			p := newProxy(t, s.srv.URL, 1200, 0)
			u := newUpstream(400, 150)
			s.start(t, "cut", u.run)
			o := s.options(tr)
			o.SSE, o.Poll, o.PollLimit = p.URL()+"/events", p.URL()+"/poll", 4
			job := client.NewJob(client.JobOptions{Options: o, Job: "cut"})
			r := newJobRecorder(client.JobState{})
			wait := follow(t, t.Context(), job, r.handle)
			r.waitText(t, 100)
			s.srv.CloseClientConnections()
			close(u.release)
			r.waitText(t, jobtest.Len16(u.text())/2)
			s.srv.CloseClientConnections()
			end, err := wait()
			checkComplete(t, u, job, end, err)
			r.check(t)
			if r.text.String() != u.text() {
				t.Fatalf("handed text differs")
			}
			if p.cuts.Load() < 3 {
				t.Fatalf("only %d connections were cut", p.cuts.Load())
			}
			t.Logf("%d connections cut, %d updates", p.cuts.Load(), len(r.updates))
		})
	}
}

// A follower stopped mid-answer (its context ended, as a process that
// exits) leaves a state that, stored as JSON and given to a new follower,
// goes on exactly: the second hands only what the first had not, from the
// saved offset and event number, and the two together are the upstream's.
// An update the handler refused is not in the state, and is handed again.
func TestJobResumesFromSavedState(t *testing.T) {
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		t.Run(string(tr), func(t *testing.T) {
			s := newJobServer(t, replayd.Options{}, replayd.JobsOptions{})
			u := newUpstream(200, 80)
			s.start(t, "resume", u.run)
			first := client.NewJob(client.JobOptions{Options: s.options(tr), Job: "resume"})
			r1 := newJobRecorder(client.JobState{})
			refused := errors.New("refused")
			var refusedOnce *client.JobText
			r1.refuse = func(up client.JobUpdate) error {
				if up.Text != nil && refusedOnce == nil {
					refusedOnce = up.Text
					return refused
				}
				return nil
			}
			end, err := follow(t, t.Context(), first, r1.handle)()
			if !errors.Is(err, refused) || end != nil {
				t.Fatalf("Run: %v, %v; want the handler's error", end, err)
			}
			if st := first.State(); st.Next != refusedOnce.Offset || jobtest.Len16(st.Text) != st.Next {
				t.Fatalf("after a refused chunk at %d the state is at %d", refusedOnce.Offset, st.Next)
			}
			// The refused chunk comes again; stop in the middle of the answer.
			r1.refuse = nil
			ctx, cancel := context.WithCancel(t.Context())
			wait := follow(t, ctx, first, r1.handle)
			r1.waitText(t, 30)
			cancel()
			if _, err := wait(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run after cancel: %v", err)
			}
			r1.check(t)
			saved, err := json.Marshal(first.State())
			if err != nil {
				t.Fatal(err)
			}
			close(u.release)

			var st client.JobState
			if err := json.Unmarshal(saved, &st); err != nil {
				t.Fatal(err)
			}
			if st.Text != r1.text.String() || st.Cursor <= 0 || st.End != nil {
				t.Fatalf("saved state %+v; first follower handed %q", st, r1.text.String())
			}
			second := client.NewJob(client.JobOptions{Options: s.options(tr), Job: "resume", State: &st})
			r2 := newJobRecorder(st) // checks the second starts at the saved offset and event number
			end, err = follow(t, t.Context(), second, r2.handle)()
			checkComplete(t, u, second, end, err)
			r2.check(t)
			if r2.text.String() != u.text() {
				t.Fatalf("saved text + the second follower's differs from the upstream's")
			}
			for _, up := range r2.updates {
				if up.Text != nil {
					if up.Text.Offset != st.Next {
						t.Fatalf("the second follower's first chunk is at %d, the saved state at %d", up.Text.Offset, st.Next)
					}
					break
				}
			}

			// A state that holds the end returns it at once, without a server.
			fin := second.State()
			third := client.NewJob(client.JobOptions{Options: client.Options{Poll: "http://127.0.0.1:1/poll"}, Job: "resume", State: &fin})
			if end, err := third.Run(t.Context(), nil); err != nil || end.Status != "complete" || third.Text() != u.text() {
				t.Fatalf("Run of a finished state: %+v, %v", end, err)
			}
		})
	}
}

// A job that fails, or that nobody read and was abandoned, ends error:
// the follower's end says so with its code, never complete, after the
// text that was written.
func TestJobErrorEnds(t *testing.T) {
	t.Run("failed", func(t *testing.T) {
		s := newJobServer(t, replayd.Options{}, replayd.JobsOptions{})
		s.start(t, "fails", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
			w.WriteString("partial 😀 answer")
			return nil, errors.New("the model is overloaded")
		})
		job := client.NewJob(client.JobOptions{Options: s.options(client.Auto), Job: "fails"})
		end, err := follow(t, t.Context(), job, nil)()
		var je *client.JobError
		if err != nil || end.Status != "error" || end.Meta != nil || !errors.As(end.Err(), &je) || je.Code != replayd.JobFailed ||
			!strings.Contains(je.Message, "overloaded") {
			t.Fatalf("end %+v (%v), %v; want error failed", end, end.Err(), err)
		}
		if job.Text() != "partial 😀 answer" {
			t.Fatalf("text %q", job.Text())
		}
	})
	t.Run("abandoned", func(t *testing.T) {
		s := newJobServer(t, replayd.Options{}, replayd.JobsOptions{AbandonAfter: 100 * time.Millisecond, Lease: 300 * time.Millisecond})
		u := newUpstream(50, 10)
		returned := make(chan error, 1)
		s.start(t, "alone", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
			meta, err := u.run(ctx, w)
			returned <- err
			return meta, err
		})
		// Nobody reads (Jobs.Get would count): the job is abandoned, and
		// its upstream's context cancelled once that is committed.
		select {
		case err := <-returned:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("the upstream returned %v", err)
			}
		case <-time.After(wiretest.WaitFor):
			t.Fatal("the unread job's upstream was not cancelled")
		}
		job := client.NewJob(client.JobOptions{Options: s.options(client.Poll), Job: "alone"})
		end, err := follow(t, t.Context(), job, nil)()
		if err != nil || end.Status != "error" || end.Error == nil || end.Error.Code != replayd.JobAbandoned {
			t.Fatalf("end %+v, %v; want error abandoned", end, err)
		}
		if want := strings.Join(u.toks[:10], ""); job.Text() != want {
			t.Fatalf("text %q, want %q", job.Text(), want)
		}
	})
}

// Over SSE, a follower that missed more than the server's replay limit
// (a finished long answer read from its start) reads the rest over polls
// when it has the poll URL, with no gap; without it, the gap is handed.
func TestJobPastTheReplayLimit(t *testing.T) {
	s := newJobServer(t, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 10}}, replayd.JobsOptions{})
	u := newUpstream(300, 0)
	s.start(t, "long", u.run)
	wiretest.WaitUntil(t, "the job to end", func() bool {
		in, err := s.jobs.Get(context.Background(), "long")
		return err == nil && in.Status == replayd.JobComplete
	})
	n, err := s.hub.Load().Replay(context.Background(), "jobs/long", 0, 1000)
	if err != nil || len(n) <= 10 {
		t.Fatalf("%d messages (%v): not past the replay limit", len(n), err)
	}

	job := client.NewJob(client.JobOptions{Options: s.options(client.SSE), Job: "long"})
	r := newJobRecorder(client.JobState{})
	end, err := follow(t, t.Context(), job, r.handle)()
	checkComplete(t, u, job, end, err)
	r.check(t) // no gap

	o := s.options(client.SSE)
	o.Poll = ""
	job = client.NewJob(client.JobOptions{Options: o, Job: "long"})
	var gaps []client.JobGap
	end, err = follow(t, t.Context(), job, func(up client.JobUpdate) error {
		if up.Gap != nil {
			gaps = append(gaps, *up.Gap)
		}
		return nil
	})()
	if err != nil || end.Status != "complete" || len(gaps) == 0 || gaps[0].Reason != "replay_limit" || gaps[0].Log == nil {
		t.Fatalf("SSE only: end %+v, %v, gaps %+v; want the replay_limit gap handed", end, err, gaps)
	}
	if st := job.State(); len(st.Gaps) == 0 || jobtest.Len16(st.Text) >= jobtest.Len16(u.text()) {
		t.Fatalf("SSE only: %d gaps, %d of %d units", len(st.Gaps), jobtest.Len16(st.Text), jobtest.Len16(u.text()))
	}
}

// Messages that overlap, repeat, or leave holes (another writer of the
// topic, or a server that replays from an earlier offset): text from an
// offset already held is cut to its new part, repeated events are
// dropped, and a hole is named by a gap, not padded.
func TestJobOverlapsRepeatsAndHoles(t *testing.T) {
	s := newJobServer(t, replayd.Options{}, replayd.JobsOptions{})
	msgs := []string{
		`{"k":"text","o":0,"t":"ab😀"}`, // 4 units
		`{"k":"text","o":2,"t":"😀cd"}`, // overlaps: "cd" is new
		`{"k":"text","o":0,"t":"ab"}`,  // held
		`{"k":"event","n":0,"e":{"a":1}}`,
		`{"k":"event","n":0,"e":{"a":1}}`, // repeated
		`{"k":"text","o":9,"t":"xy"}`,     // a hole of 6..9
		`{"k":"event","n":2,"e":{"a":3}}`, // event 1 missing
		`{"not":"a job message"}`,
		`{"k":"end","status":"complete","meta":null}`,
	}
	for _, m := range msgs {
		if _, err := s.hub.Load().Publish(context.Background(), "jobs/raw", json.RawMessage(m)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		job := client.NewJob(client.JobOptions{Options: s.options(tr), Job: "raw"})
		var got []string
		end, err := follow(t, t.Context(), job, func(u client.JobUpdate) error {
			switch {
			case u.Text != nil:
				got = append(got, fmt.Sprintf("text %d %s", u.Text.Offset, u.Text.Chunk))
			case u.Event != nil:
				got = append(got, fmt.Sprintf("event %d %s", u.Event.N, u.Event.Data))
			case u.Gap != nil:
				got = append(got, fmt.Sprintf("gap %s %d-%d", u.Gap.Reason, u.Gap.From, u.Gap.To))
			case u.End != nil:
				got = append(got, "end "+u.End.Status+" "+string(u.End.Meta))
			}
			return nil
		})()
		want := []string{
			"text 0 ab😀", "text 4 cd", `event 0 {"a":1}`, "gap text_missing 6-9", "text 9 xy",
			"gap events_missing 1-2", `event 2 {"a":3}`, "end complete null",
		}
		if err != nil || end.Status != "complete" || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("%s: %v, %v\n got %q\nwant %q", tr, end, err, got, want)
		}
		st := job.State()
		if st.Text != "ab😀cdxy" || st.Next != 11 || len(st.Events) != 3 || st.Events[1] != nil || len(st.Gaps) != 2 {
			t.Fatalf("%s: state %+v", tr, st)
		}
	}
}
