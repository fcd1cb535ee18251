package replaydpg

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/childproc"
	"github.com/replayd/replayd/internal/nodetest"
	"github.com/replayd/replayd/internal/testenv"
)

// Crash durability on PostgreSQL with fsync and synchronous_commit on (the
// second cluster of .ci/pg.sh): two node processes publish as fast as they
// can and report every publish that returned; each round ends the nodes
// with SIGKILL mid-publish, and every other round first crashes the
// PostgreSQL server itself (SIGKILL of the postmaster and every server
// process) and starts it again while the nodes keep retrying. After each
// round: every acknowledged event is in the log exactly once, with its
// sequence, intact; sequences run 1..head without a hole (nothing is
// pruned here); a publish retried with the same event id (by the nodes
// across the crash, and by the test afterwards) is never stored twice; and
// SSE and poll clients that hopped between the nodes and the test's own
// hub, and a resume from the cursor a client held when the crash struck,
// get exactly the rest.

const (
	crashDSNEnv    = "REPLAYD_PG_CRASH_DSN" // run as a crash-test node on this DSN
	crashPrefixEnv = "REPLAYD_PG_CRASH_PREFIX"
	crashNameEnv   = "REPLAYD_PG_CRASH_NAME"
	crashType      = "message"
)

var crashTopics = []string{"a", "b", "c", ""}

// fsyncCluster returns the DSN and the control script of the fsync
// cluster (.ci/pg.sh with REPLAYD_PG_FSYNC_CLUSTER=1), after checking that
// it keeps fsync, synchronous_commit and full_page_writes on. Without one
// the test skips on a developer machine and fails under CI=true.
func fsyncCluster(t *testing.T) (dsn, ctl string) {
	t.Helper()
	env := testenv.Need(t, "the fsync cluster", "REPLAYD_PG_FSYNC_CLUSTER=1 source .ci/pg.sh", "REPLAYD_PG_FSYNC_DSN", "REPLAYD_PG_FSYNC_CTL")
	dsn, ctl = env[0], env[1]
	pool := testPoolDSN(t, dsn)
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		var v string
		if err := pool.QueryRow(testCtx(t, 10*time.Second), "SHOW "+name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != "on" {
			t.Fatalf("the fsync cluster has %s = %s: a crash test there proves nothing", name, v)
		}
	}
	pool.Close()
	return dsn, ctl
}

// crashCtl runs the cluster's control script ("crash" or "start").
func crashCtl(t *testing.T, ctl, verb string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, ctl, verb).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", ctl, verb, err, out)
	}
}

func TestCrashDurability(t *testing.T) {
	if dsn := os.Getenv(crashDSNEnv); dsn != "" {
		runCrashNode(dsn, os.Getenv(crashPrefixEnv), os.Getenv(crashNameEnv))
		os.Exit(0)
	}
	dsn, ctl := fsyncCluster(t)
	prefix := testPrefixDSN(t, dsn)
	t.Cleanup(func() { crashCtl(t, ctl, "start") }) // up again, even if the test failed with it down
	began := time.Now()
	seed := uint64(began.UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d", seed)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// The test's own hub is a third node, up throughout, the crashes of
	// the server included.
	s := openPrefixDSN(t, prefix, dsn)
	hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 1 << 20, HeartbeatInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	stopTail, err := hub.StartTail(200*time.Millisecond, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/poll", hub.PollHandler())
	mux.Handle("/", hub.Handler())
	srv := httptest.NewServer(mux)
	defer func() {
		srv.CloseClientConnections()
		srv.Close()
		stopTail()
		hub.Close()
	}()

	tr := nodetest.NewTruth(seed)
	cl := &nodetest.Cluster{Limit: 1 << 20, Outages: true}
	cl.SetAddr(2, srv.URL, 1)

	// Clients hop between the two nodes and the test's hub; they may find
	// the database down (a 503 to a poll, a stream that ends before its
	// hello) and then try another node.
	specs := []nodetest.Spec{{Scope: nil, Mode: nodetest.OverSSE}, {Scope: []string{"a"}, Mode: nodetest.OverSSE},
		{Scope: nil, Mode: nodetest.OverBoth}, {Scope: []string{"b"}, Mode: nodetest.OverPoll}}
	var clients []*nodetest.Client
	stopClients := func() {}
	defer func() { stopClients() }()

	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	acks := map[string]int64{} // event id → acknowledged sequence
	var totalRetried, totalInFlight, totalUnacked int
	for round := 1; round <= rounds; round++ {
		crash := round%2 == 0
		nodes := make([]*crashProc, 2)
		for i := range nodes {
			nodes[i] = startCrashNode(t, dsn, prefix, fmt.Sprintf("r%dn%d", round, i))
			select {
			case addr := <-nodes[i].addr:
				cl.SetAddr(i, addr, round)
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: node %d did not start within 30s: %s", round, i, nodes[i].Stderr())
			}
		}
		if round == 1 {
			clients, stopClients = nodetest.StartClients(ctx, tr, cl, specs, nil)
		}
		for i, p := range nodes {
			if !p.waitAcks(1, 30*time.Second) {
				t.Fatalf("round %d: node %d acknowledged nothing within 30s: %s", round, i, p.Stderr())
			}
		}
		nodetest.SleepCtx(ctx, time.Duration(100+rng.IntN(500))*time.Millisecond)

		var atCrash int64 // a client's cursor when the server died
		if crash {
			atCrash = clients[0].CursorNow()
			crashed := time.Now()
			before := []int{nodes[0].ackCount(), nodes[1].ackCount()}
			crashCtl(t, ctl, "crash")
			down := time.Duration(rng.IntN(300)) * time.Millisecond
			nodetest.SleepCtx(ctx, down)
			crashCtl(t, ctl, "start")
			back := time.Since(crashed)
			// Every node publishes again: its hub recovered on its own.
			for i, p := range nodes {
				if !p.waitAcks(before[i]+1, 30*time.Second) {
					t.Fatalf("round %d: node %d acknowledged nothing within 30s of the server's restart: %s", round, i, p.Stderr())
				}
			}
			t.Logf("round %d: server SIGKILLed, down %v, back after %v; nodes publishing again %v after the crash",
				round, down, back.Round(time.Millisecond), time.Since(crashed).Round(time.Millisecond))
			nodetest.SleepCtx(ctx, time.Duration(100+rng.IntN(400))*time.Millisecond)
		}
		for _, p := range nodes {
			p.Kill()
		}
		// A batch a node sent before it died may still commit: wait until
		// the server has ended the dead nodes' sessions, so that the log
		// holds still while it is checked.
		if err := waitSessionsGone(ctx, s, fmt.Sprintf("replayd-crash-r%dn%%", round)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		inFlight := map[string]bool{} // tried, not acknowledged
		for i, p := range nodes {
			state := p.Wait() // the rest of stdout is read
			if state.Exited() {
				t.Fatalf("round %d: node %d exited by itself (%v) instead of being killed: %s", round, i, state, p.Stderr())
			}
			cl.SetAddr(i, "", round)
			p.mu.Lock()
			for id, seq := range p.acks {
				acks[id] = seq
			}
			for id := range p.tried {
				if _, ok := p.acks[id]; !ok {
					inFlight[id] = true
				}
			}
			totalRetried += p.retried
			p.mu.Unlock()
		}

		// The log, as the store reads it after the crash.
		rows := crashLog(t, s, round, acks, tr)
		head, err := s.Head(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(rows); n > 0 && head < rows[n-1].Sequence {
			t.Fatalf("round %d: head %d below the newest row %d", round, head, rows[n-1].Sequence)
		}
		unacked := 0
		inLog := map[string]int64{}
		for _, r := range rows {
			inLog[r.EventID] = r.Sequence
			if _, ok := acks[r.EventID]; !ok && strings.HasPrefix(r.EventID, fmt.Sprintf("r%dn", round)) {
				unacked++
			}
		}

		// Retries after the crash, as a client would send them: the events
		// in flight when the nodes died (stored or not) and a sample of the
		// acknowledged ones, with the same ids and payloads.
		retry := slices.Sorted(func(yield func(string) bool) {
			for id := range inFlight {
				if !yield(id) {
					return
				}
			}
		})
		ackedIDs := slices.Sorted(func(yield func(string) bool) {
			for id := range acks {
				if !yield(id) {
					return
				}
			}
		})
		for range 20 {
			retry = append(retry, ackedIDs[rng.IntN(len(ackedIDs))])
		}
		fresh := 0
		for _, id := range retry {
			ev, err := hub.Publish(ctx, crashTopic(id), json.RawMessage(crashPayload(id)), replayd.WithEventID(id), replayd.WithType(crashType))
			if err != nil {
				t.Fatalf("round %d: retry of %s: %v", round, id, err)
			}
			switch seq, ok := inLog[id]; {
			case ok && ev.Sequence != seq:
				t.Errorf("round %d: retry of %s (sequence %d) came back as %d", round, id, seq, ev.Sequence)
			case !ok && ev.Sequence <= head:
				t.Errorf("round %d: retry of %s, not in the log, got sequence %d at head %d", round, id, ev.Sequence, head)
			case !ok:
				inLog[id] = ev.Sequence
				acks[id] = ev.Sequence
				fresh++
			}
		}
		before := len(rows)
		rows = crashLog(t, s, round, acks, tr)
		if want := before + fresh; len(rows) != want {
			t.Errorf("round %d: %d rows after the retries, want %d (%d before, %d new)", round, len(rows), want, before, fresh)
		}

		// Every client catches up with the newest event of its scope on the
		// surviving hub; it receives everything exactly once, in order.
		nodetest.CatchUp(t, ctx, tr, clients, 30*time.Second)
		if crash {
			want := make([]int64, 0, len(rows))
			for _, r := range rows {
				if r.Sequence > atCrash {
					want = append(want, r.Sequence)
				}
			}
			if got := resumeAll(t, srv.URL, atCrash, rows[len(rows)-1].Sequence); !slices.Equal(got, want) {
				t.Errorf("round %d: a resume from %d, the cursor held at the crash, got %d events, want %d: %s", round, atCrash, len(got), len(want), firstDiff(got, want))
			}
		}
		if errs := tr.Errors(); len(errs) > 0 {
			t.Fatalf("round %d: %d violations, the first: %v", round, len(errs), errs[:min(len(errs), 10)])
		}
		t.Logf("round %d (%s): %d acknowledged events (the nodes' and the test's retries) in the log, %d committed but unacknowledged, %d in flight retried by the test (%d stored by the retry), head %d",
			round, map[bool]string{false: "nodes SIGKILLed", true: "server crashed, then nodes SIGKILLed"}[crash], len(acks), unacked, len(inFlight), fresh, len(rows))
		totalInFlight += len(inFlight)
		totalUnacked += unacked
	}
	stopClients()
	rep := tr.Check(t, hub, clients)
	if n := rep.Gaps["pruned"] + rep.Gaps["replay_limit"] + rep.PollGaps["pruned"]; n > 0 {
		t.Errorf("%d gaps with nothing pruned", n)
	}
	received, polls := rep.Events+rep.PollEvents, rep.Answers
	if totalRetried == 0 {
		t.Errorf("no node retried a publish: the server crash failed none")
	}
	t.Logf("%d rounds: %d events acknowledged and verified, %d committed but unacknowledged, %d in flight at a kill, %d publishes retried by the nodes across the crash; clients received %d events (%d polls); %v",
		rounds, len(acks), totalUnacked, totalInFlight, totalRetried, received, polls, time.Since(began).Round(time.Millisecond))
}

// crashLog reads the whole log and checks it: sequences increasing, global
// ordinals 1..n without a hole (sequences jump at every node's Open: the
// sequence floor), every row intact (type, topic and payload follow from its id), no
// event id twice, every acknowledged event at its sequence. The rows go to
// tr.
func crashLog(t *testing.T, s *Store, round int, acks map[string]int64, tr *nodetest.Truth) []replayd.Event {
	t.Helper()
	rows := allEvents(t, s)
	q, err := s.pool.Query(context.Background(), "SELECT global_ord FROM "+s.prefix+"events ORDER BY sequence")
	if err != nil {
		t.Fatal(err)
	}
	ords, err := pgx.CollectRows(q, pgx.RowTo[int64])
	if err != nil || len(ords) != len(rows) {
		t.Fatalf("round %d: %d ordinals for %d rows: %v", round, len(ords), len(rows), err)
	}
	ids := make(map[string]int64, len(rows))
	for i, r := range rows {
		if ords[i] != int64(i)+1 || (i > 0 && r.Sequence <= rows[i-1].Sequence) {
			t.Fatalf("round %d: row %d has sequence %d, ordinal %d: a hole in the log", round, i+1, r.Sequence, ords[i])
		}
		if prev, ok := ids[r.EventID]; ok {
			t.Errorf("round %d: event %s stored twice, at %d and %d", round, r.EventID, prev, r.Sequence)
		}
		ids[r.EventID] = r.Sequence
		if r.Type != crashType || r.Topic != crashTopic(r.EventID) || string(r.Payload) != string(crashPayload(r.EventID)) {
			t.Errorf("round %d: row %d (%s) is torn or foreign: type %q, topic %q, %d payload bytes", round, r.Sequence, r.EventID, r.Type, r.Topic, len(r.Payload))
		}
		tr.Add(r, acks[r.EventID] == r.Sequence)
	}
	for id, seq := range acks {
		switch got, ok := ids[id]; {
		case !ok:
			t.Errorf("round %d: acknowledged event %s (sequence %d) is missing", round, id, seq)
		case got != seq:
			t.Errorf("round %d: acknowledged event %s at sequence %d is stored at %d", round, id, seq, got)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return rows
}

// waitSessionsGone waits, for at most 20 s, until no server session's
// application_name is LIKE pattern.
func waitSessionsGone(ctx context.Context, s *Store, pattern string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1`, pattern).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sessions of the killed nodes still open after 20s", n)
		}
		nodetest.SleepCtx(ctx, 10*time.Millisecond)
	}
}

// resumeAll resumes an SSE stream from cursor on base and returns the
// sequences it receives until one reaches head (at most 30 s).
func resumeAll(t *testing.T, base string, cursor, head int64) []int64 {
	t.Helper()
	var got []int64
	if cursor >= head {
		return got
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Last-Event-ID", strconv.FormatInt(cursor, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	frames := make(chan sseFrame, 64)
	go readSSE(resp.Body, frames)
	defer func() {
		cancel()
		for range frames {
		}
	}()
	for f := range frames {
		switch f.event {
		case "hello", "heartbeat":
		case "message":
			seq, err := strconv.ParseInt(f.id, 10, 64)
			if err != nil {
				t.Fatalf("bad id %q", f.id)
			}
			got = append(got, seq)
			if seq >= head {
				return got
			}
		default:
			t.Errorf("resume from %d: frame %s %s", cursor, f.event, f.data)
		}
	}
	t.Errorf("resume from %d: the stream ended at %v before %d", cursor, got[max(0, len(got)-1):], head)
	return got
}

func firstDiff(got, want []int64) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("at %d: %d, want %d", i, got[i], want[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(got), len(want))
}

// crashTopic and crashPayload follow from the event id, so the test checks
// rows it never got an acknowledgement for. The payload is a JSON object of
// up to 8 KiB.
func crashTopic(id string) string {
	sum := sha256.Sum256([]byte(id))
	return crashTopics[int(sum[31])%len(crashTopics)]
}

func crashPayload(id string) []byte {
	sum := sha256.Sum256([]byte(id))
	n := int(binary.BigEndian.Uint16(sum[:2])) % (8 << 10)
	pad := make([]byte, n)
	for i := range pad {
		pad[i] = "0123456789abcdef"[sum[i%len(sum)]&15]
	}
	return fmt.Appendf(nil, `{"id":%q,"topic":%q,"pad":"%s"}`, id, crashTopic(id), pad)
}

// runCrashNode is the child: a hub on the log with StartTail, its SSE and
// poll handlers on 127.0.0.1, and three publishers publishing as fast as
// they can. It prints "addr <url>", "try <id>" before an event's first
// attempt, "ack <sequence> <id> <attempts>" when a publish returns, and
// "retry <id>" when one fails (the server is down): it tries again with
// the same id until it succeeds. It exits when stdin ends.
func runCrashNode(dsn, prefix, name string) {
	die := func(err error) {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	s, err := Open(ctx, dsn, WithTablePrefix(prefix))
	if err != nil {
		die(err)
	}
	hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 1 << 20, HeartbeatInterval: -1}})
	if err != nil {
		die(err)
	}
	if _, err := hub.StartTail(200*time.Millisecond, replayd.TailOptions{}); err != nil {
		die(err)
	}
	say, err := nodetest.Serve(hub)
	if err != nil {
		die(err)
	}
	for w := range 3 {
		go func() {
			for n := 0; ; n++ {
				id := fmt.Sprintf("%s-w%d-%d", name, w, n)
				say("try %s", id)
				for attempt := 1; ; attempt++ {
					pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					ev, err := hub.Publish(pctx, crashTopic(id), json.RawMessage(crashPayload(id)), replayd.WithEventID(id), replayd.WithType(crashType))
					cancel()
					if err == nil {
						say("ack %d %s %d", ev.Sequence, id, attempt)
						break
					}
					if attempt == 1 {
						fmt.Fprintf(os.Stderr, "node: publish %s: %v\n", id, err)
					}
					say("retry %s", id)
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// crashProc is a crash-test node process.
type crashProc struct {
	*childproc.Proc
	addr chan string

	mu      sync.Mutex
	acks    map[string]int64
	tried   map[string]bool
	retried int           // publishes acknowledged after more than one attempt
	acked   chan struct{} // closed and replaced at every acknowledgement
}

func (p *crashProc) ackCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acks)
}

// waitAcks waits until the node has acknowledged n events, for at most d.
func (p *crashProc) waitAcks(n int, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		p.mu.Lock()
		have, ch := len(p.acks), p.acked
		p.mu.Unlock()
		if have >= n {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

func startCrashNode(t *testing.T, dsn, prefix, name string) *crashProc {
	t.Helper()
	p := &crashProc{addr: make(chan string, 1), acks: map[string]int64{}, tried: map[string]bool{}, acked: make(chan struct{})}
	p.Proc = childproc.Start(t, "TestCrashDurability", func(stdout io.Reader) {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			p.mu.Lock()
			switch {
			case len(f) == 2 && f[0] == "addr":
				p.addr <- f[1]
			case len(f) == 2 && f[0] == "try":
				p.tried[f[1]] = true
			case len(f) == 2 && f[0] == "retry":
			case len(f) == 4 && f[0] == "ack":
				seq, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					t.Errorf("%s: %q", name, sc.Text())
					break
				}
				p.acks[f[2]] = seq
				if f[3] != "1" {
					p.retried++
				}
				close(p.acked)
				p.acked = make(chan struct{})
			default:
				t.Errorf("%s: unexpected line %q", name, sc.Text())
			}
			p.mu.Unlock()
		}
	}, crashDSNEnv+"="+withDSNParam(dsn, "application_name", "replayd-crash-"+name), crashPrefixEnv+"="+prefix, crashNameEnv+"="+name)
	return p
}
