package hubtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/jobtest"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/childproc"
)

// Job streams across OS processes (SPEC §20): two processes, each its own
// hub on one log, race starts of the same ids; a process running a job is
// SIGKILLed mid-answer and the job is read from another hub on the log. A
// backend's test runs them with RunJobsProcesses; its test function is
// also the child processes', which call JobsChild first:
//
//	func TestJobsProcesses(t *testing.T) {
//		if hubtest.JobsChild(t, func(opts replayd.Options) *replayd.EventHub {
//			return openHubAt(t, os.Getenv("MY_LOG"), opts) // the log the parent named
//		}) {
//			return
//		}
//		hubtest.RunJobsProcesses(t, "TestJobsProcesses", func(t *testing.T) hubtest.JobsLog {
//			log := newLog(t)
//			return hubtest.JobsLog{Env: []string{"MY_LOG=" + log},
//				Open: func(opts replayd.Options) *replayd.EventHub { return openHubAt(t, log, opts) }}
//		})
//	}

// JobsLog is one new log for RunJobsProcesses's subtests: Env is what a
// child process needs to open a hub on it (added to the child's
// environment; the child's JobsChild opens it), Open opens a hub on it in
// the test's own process (its own store, as another node or the node
// restarted).
type JobsLog struct {
	Env  []string
	Open func(opts replayd.Options) *replayd.EventHub
}

// The child's environment: its part, its name, the job lease (ms).
const (
	jobsChildEnv      = "REPLAYD_HUBTEST_JOBS_CHILD"
	jobsChildNameEnv  = "REPLAYD_HUBTEST_JOBS_NAME"
	jobsChildLeaseEnv = "REPLAYD_HUBTEST_JOBS_LEASE_MS"
)

// RunJobsProcesses runs the subtests with child processes: test is the
// name of the backend's test function, which the children run again
// (internal/childproc) and which must call JobsChild first; newLog makes
// each subtest's log. A few seconds in all.
func RunJobsProcesses(t *testing.T, test string, newLog func(t *testing.T) JobsLog) {
	t.Run("StartRace", func(t *testing.T) { checkJobsStartRace(t, test, newLog(t)) })
	t.Run("Killed", func(t *testing.T) { checkJobKilled(t, test, newLog(t)) })
}

// JobsChild runs a child's part of RunJobsProcesses, with a hub open
// opens on the log its environment names, and returns true, when this
// process is such a child; else it returns false at once.
func JobsChild(t *testing.T, open func(opts replayd.Options) *replayd.EventHub) bool {
	part := os.Getenv(jobsChildEnv)
	if part == "" {
		return false
	}
	out := &lineWriter{w: os.Stdout}
	name := os.Getenv(jobsChildNameEnv)
	lease, _ := strconv.Atoi(os.Getenv(jobsChildLeaseEnv))
	h := open(replayd.Options{})
	j, err := h.Jobs(replayd.JobsOptions{Lease: time.Duration(lease) * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	switch part {
	case "race":
		raceChild(t, h, j, name, out)
	case "kill":
		killChild(t, j, out)
	default:
		t.Fatalf("unknown part %q", part)
	}
	return true
}

// lineWriter writes whole lines, each with one write; a child whose parent
// is gone exits.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := fmt.Fprintf(l.w, format+"\n", args...); err != nil {
		os.Exit(4)
	}
}

// jobsProc is a child process whose stdout lines arrive on lines, with
// its index; a line "" with eof set ends them.
type jobsProc struct {
	*childproc.Proc
	i int
}

type procLine struct {
	proc int
	line string
	eof  bool
}

// startJobsProcs starts n children running part of test on lg's log,
// their stdout lines merged into the channel returned.
func startJobsProcs(t *testing.T, test, part string, lg JobsLog, lease time.Duration, n int) ([]*jobsProc, <-chan procLine) {
	t.Helper()
	lines := make(chan procLine, 4096)
	stop := make(chan struct{})
	procs := make([]*jobsProc, n)
	for i := range procs {
		env := append([]string{jobsChildEnv + "=" + part, fmt.Sprintf("%s=p%d", jobsChildNameEnv, i),
			fmt.Sprintf("%s=%d", jobsChildLeaseEnv, lease.Milliseconds())}, lg.Env...)
		procs[i] = &jobsProc{i: i, Proc: childproc.Start(t, test, func(stdout io.Reader) {
			sc := bufio.NewScanner(stdout)
			send := func(l procLine) bool {
				select {
				case lines <- l:
					return true
				case <-stop:
					return false
				}
			}
			for sc.Scan() {
				if !send(procLine{proc: i, line: sc.Text()}) {
					return
				}
			}
			send(procLine{proc: i, eof: true})
		}, env...)}
	}
	// Registered after childproc's cleanups, so it runs first: a reader
	// nobody listens to any more returns.
	t.Cleanup(func() { close(stop) })
	return procs, lines
}

// next returns the next line of any child (bounded by d).
func next(t *testing.T, lines <-chan procLine, procs []*jobsProc, d time.Duration) procLine {
	t.Helper()
	select {
	case l := <-lines:
		return l
	case <-time.After(d):
		var errs []string
		for _, p := range procs {
			errs = append(errs, fmt.Sprintf("p%d's stderr:\n%s", p.i, p.Stderr()))
		}
		t.Fatalf("no line from the children within %v\n%s", d, strings.Join(errs, "\n"))
		return procLine{}
	}
}

const raceIDs = 100

// raceChild: "ready", then at a line on stdin 100 concurrent starts of the
// ids race-0..99, whose upstreams say "ran <id>" and write the process's
// name as the job's text; each start says "start <id> <started 0|1>
// <startedAt ms>"; once every job this process started is complete, "span
// <first start ms> <last return ms>" and "done".
func raceChild(t *testing.T, h *replayd.EventHub, j *replayd.Jobs, name string, out *lineWriter) {
	out.printf("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("stdin: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var mine []string
	began := time.Now()
	for i := range raceIDs {
		id := fmt.Sprintf("race-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, started, err := j.Start(context.Background(), id, func(ctx context.Context, w *replayd.JobWriter) (any, error) {
				out.printf("ran %s", id)
				_, err := w.WriteString(name)
				return nil, err
			})
			if err != nil {
				t.Errorf("start %s: %v", id, err)
				return
			}
			b := 0
			if started {
				b = 1
				mu.Lock()
				mine = append(mine, id)
				mu.Unlock()
			}
			out.printf("start %s %d %d", id, b, in.Created.UnixMilli())
		}()
	}
	wg.Wait()
	ended := time.Now()
	for _, id := range mine {
		waitJob(t, j, id, replayd.JobComplete)
	}
	out.printf("span %d %d", began.UnixMilli(), ended.UnixMilli())
	out.printf("done")
	h.Close()
}

// Two processes, each its own hub on one log, race 100 starts of the
// same 100 ids, released together: every id's upstream ran exactly once
// across both processes, exactly one Start said started, both processes'
// Start returned the same job (its startedAt), and the job's text names
// the process that said started. The two processes' starts overlap in
// time (else nothing raced).
func checkJobsStartRace(t *testing.T, test string, lg JobsLog) {
	procs, lines := startJobsProcs(t, test, "race", lg, 0, 2)
	const bound = 60 * time.Second
	for ready := 0; ready < len(procs); {
		l := next(t, lines, procs, bound)
		if l.eof {
			t.Fatalf("p%d ended before it was ready: %s", l.proc, procs[l.proc].Stderr())
		}
		if l.line == "ready" {
			ready++
		}
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.Stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	type start struct {
		started bool
		at      int64
	}
	ran := map[string][]int{}
	starts := map[string][]start{}
	owner := map[string]int{}
	spans := make([][2]int64, len(procs))
	finished := make([]bool, len(procs)) // said done: its end of output is due
	for done := 0; done < len(procs); {
		l := next(t, lines, procs, bound)
		if l.eof {
			if finished[l.proc] {
				continue // a child that was done exits while another is not
			}
			t.Fatalf("p%d ended before it was done: %s", l.proc, procs[l.proc].Stderr())
		}
		f := strings.Fields(l.line)
		switch {
		case l.line == "done":
			finished[l.proc] = true
			done++
		case len(f) == 2 && f[0] == "ran":
			ran[f[1]] = append(ran[f[1]], l.proc)
		case len(f) == 4 && f[0] == "start":
			at, _ := strconv.ParseInt(f[3], 10, 64)
			starts[f[1]] = append(starts[f[1]], start{started: f[2] == "1", at: at})
			if f[2] == "1" {
				owner[f[1]] = l.proc
			}
		case len(f) == 3 && f[0] == "span":
			spans[l.proc][0], _ = strconv.ParseInt(f[1], 10, 64)
			spans[l.proc][1], _ = strconv.ParseInt(f[2], 10, 64)
		}
	}
	for _, p := range procs {
		if st := p.Wait(); !st.Success() {
			t.Fatalf("p%d: %v\n%s", p.i, st, p.Stderr())
		}
	}
	won := make([]int, len(procs))
	_, j := openJobs(t, lg.Open, replayd.JobsOptions{})
	for i := range raceIDs {
		id := fmt.Sprintf("race-%d", i)
		if len(ran[id]) != 1 {
			t.Errorf("%s: the upstream ran in %v", id, ran[id])
			continue
		}
		ss := starts[id]
		n := 0
		for _, s := range ss {
			if s.started {
				n++
			}
		}
		if len(ss) != len(procs) || n != 1 || ss[0].at != ss[1].at || ss[0].at == 0 {
			t.Errorf("%s: starts %+v", id, ss)
			continue
		}
		if owner[id] != ran[id][0] {
			t.Errorf("%s: ran in p%d, started in p%d", id, ran[id][0], owner[id])
		}
		won[owner[id]]++
		p, err := j.Read(context.Background(), id, 0, 0)
		if err != nil || p.Status != replayd.JobComplete || p.Append != fmt.Sprintf("p%d", owner[id]) || p.Created.UnixMilli() != ss[0].at {
			t.Errorf("%s read from a third hub: %+v %v", id, p, err)
		}
	}
	if spans[0][0] > spans[1][1] || spans[1][0] > spans[0][1] {
		t.Errorf("the processes' starts did not overlap: %v", spans)
	}
	t.Logf("ids started by p0: %d, by p1: %d; start spans (ms) %d-%d and %d-%d", won[0], won[1],
		0, spans[0][1]-spans[0][0], spans[1][0]-spans[0][0], spans[1][1]-spans[0][0])
}

// killToken is the child's i-th write: with a character of two UTF-16
// units, so that the offsets the child reports are UTF-16 ones.
func killToken(i int) string { return fmt.Sprintf("w%d😀 ", i) }

// killAnswer is the first n writes.
func killAnswer(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(killToken(i))
	}
	return b.String()
}

const killGap = 5 * time.Millisecond

// killChild runs job "answer", whose upstream writes killToken(i) every
// 5 ms and says "w <i>" after each write; a reader on the same hub reads
// the job by offsets every 2 ms and says "d <UTF-16 length>" whenever the
// text it read grew: what it read was committed (the hub reads it back
// from the store), so it survives the process. It runs until killed (or
// a bound).
func killChild(t *testing.T, j *replayd.Jobs, out *lineWriter) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := j.Start(ctx, "answer", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		for i := 0; ; i++ {
			if _, err := w.WriteString(killToken(i)); err != nil {
				return nil, err
			}
			out.printf("w %d", i)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(killGap):
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	var off int64
	for ctx.Err() == nil {
		p, err := j.Read(ctx, "answer", off, 0)
		if err != nil {
			t.Fatal(err)
		}
		if p.Append != "" {
			off = p.NextOffset
			out.printf("d %d", off)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A process running a job is SIGKILLed mid-answer (right after a write,
// with text pending); a hub opened afterwards on the log (the node
// restarted, or another node) reads the job: until the dead node's lease
// lapses it is streaming, then error interrupted, never complete. The
// text read, by a stream-relay client following the job over real HTTP
// and by Jobs.Read, is a prefix of what the upstream wrote, and holds at
// least everything the child had read back as committed; the job's
// stream holds that text without a hole, then the end message (error
// interrupted) and no other end.
func checkJobKilled(t *testing.T, test string, lg JobsLog) {
	const lease = 600 * time.Millisecond
	procs, lines := startJobsProcs(t, test, "kill", lg, lease, 1)
	wrote, durable := -1, int64(0)
	take := func(l procLine) {
		f := strings.Fields(l.line)
		if len(f) != 2 {
			return
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "w":
			wrote = max(wrote, int(v))
		case "d":
			durable = max(durable, v)
		}
	}
	// Mid-answer: 40 writes committed, then at the next write.
	floor := jobtest.Len16(killAnswer(40))
	for durable < floor {
		l := next(t, lines, procs, 30*time.Second)
		if l.eof {
			t.Fatalf("the child ended: %s", procs[0].Stderr())
		}
		take(l)
	}
	for w := wrote; wrote == w; {
		l := next(t, lines, procs, 10*time.Second)
		if l.eof {
			t.Fatalf("the child ended: %s", procs[0].Stderr())
		}
		take(l)
	}
	procs[0].Kill()
	killed := time.Now()
	for {
		l := next(t, lines, procs, 10*time.Second)
		if l.eof {
			break
		}
		take(l)
	}
	if st := procs[0].Wait(); st.Success() || st.ExitCode() != -1 {
		t.Fatalf("the child was not killed: %v", st)
	}
	// The child may have written one more token than it said.
	written := killAnswer(wrote + 2)

	h, j := openJobs(t, lg.Open, replayd.JobsOptions{Lease: lease})
	in, err := j.Get(context.Background(), "answer")
	if err != nil || in.Status == replayd.JobComplete {
		t.Fatalf("right after the kill: %+v %v", in, err)
	}
	srv := httptest.NewServer(j.RelayHandler(replayd.JobsRelayOptions{Prefix: "/",
		Upstream: func(*http.Request, json.RawMessage) replayd.JobFunc { return nil }}))
	defer srv.Close()
	var text strings.Builder
	var off, evOff int64
	var last relayAnswer
	statuses := map[string]int{}
	deadline := time.Now().Add(lease + waitFor)
	for {
		last = relayGet(t, srv.URL, "answer", off, evOff)
		statuses[last.Status]++
		if last.NextOffset != off+jobtest.Len16(last.Append) {
			t.Fatalf("relay from %d: %q, next %d", off, last.Append, last.NextOffset)
		}
		text.WriteString(last.Append)
		off, evOff = last.NextOffset, last.NextEventOffset
		if last.Status != "streaming" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still streaming %v after the kill", time.Since(killed))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ended := time.Since(killed)
	got := text.String()
	if last.Status != "error" || last.Complete || last.Final != nil || last.ErrorInfo == nil || last.ErrorInfo.Code != replayd.JobInterrupted {
		t.Fatalf("the end the relay client read: status %s, complete %v, errorInfo %+v, final %s", last.Status, last.Complete, last.ErrorInfo, last.Final)
	}
	if !strings.HasPrefix(written, got) {
		t.Fatalf("the text read is not a prefix of what the upstream wrote:\n%q\nwrote\n%q", got, written)
	}
	if jobtest.Len16(got) < durable {
		t.Fatalf("the text read (%d UTF-16 units) lost committed text (%d units read back in the child)", jobtest.Len16(got), durable)
	}
	p, err := j.Read(context.Background(), "answer", 0, 0)
	if err != nil || p.Append != got || p.Status != replayd.JobError || p.Err == nil || p.Err.Code != replayd.JobInterrupted {
		t.Fatalf("Jobs.Read after the end: %+v %v", p, err)
	}
	// The stream: the text, offsets without a hole, then one end.
	evs, err := h.Replay(context.Background(), j.Topic("answer"), 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var stream strings.Builder
	var ends []string
	for _, ev := range evs {
		var m struct {
			K      string `json:"k"`
			O      *int64 `json:"o"`
			T      string `json:"t"`
			Status string `json:"status"`
			Err    *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(ev.Payload, &m) != nil || m.K == "" {
			continue // a marker
		}
		if len(ends) > 0 {
			t.Fatalf("a message after the end: %s", ev.Payload)
		}
		switch m.K {
		case "text":
			if m.O == nil || *m.O != jobtest.Len16(stream.String()) {
				t.Fatalf("a text message at %v after %d units", m.O, jobtest.Len16(stream.String()))
			}
			stream.WriteString(m.T)
		case "end":
			code := ""
			if m.Err != nil {
				code = m.Err.Code
			}
			ends = append(ends, m.Status+" "+code)
		}
	}
	if stream.String() != got || len(ends) != 1 || ends[0] != "error "+replayd.JobInterrupted {
		t.Fatalf("the job's stream: %d units of text (read %d), ends %v", jobtest.Len16(stream.String()), jobtest.Len16(got), ends)
	}
	lost := jobtest.Len16(written) - jobtest.Len16(got)
	t.Logf("killed after write %d; %d of %d UTF-16 units survived (%d read back as committed in the child); "+
		"up to %d units (about %v of writes) lost; statuses read %v; interrupted %v after the kill (lease %v)",
		wrote, jobtest.Len16(got), jobtest.Len16(written), durable, lost, time.Duration(lost/jobtest.Len16(killToken(wrote)))*killGap,
		statuses, ended.Round(time.Millisecond), lease)
}

// relayAnswer is what checkJobKilled reads of a stream-relay v2 GET.
type relayAnswer struct {
	Status          string          `json:"status"`
	Complete        bool            `json:"complete"`
	Append          string          `json:"append"`
	NextOffset      int64           `json:"nextOffset"`
	NextEventOffset int64           `json:"nextEventOffset"`
	Final           json.RawMessage `json:"final"`
	ErrorInfo       *struct {
		Code string `json:"code"`
	} `json:"errorInfo"`
}

func relayGet(t *testing.T, base, id string, since, eventSince int64) relayAnswer {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("%s/streams/%s?since=%d&eventSince=%d", base, id, since, eventSince))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a relayAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", id, resp.StatusCode, err)
	}
	return a
}
