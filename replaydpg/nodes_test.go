package replaydpg

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
	"github.com/replayd/replayd/internal/childproc"
	"github.com/replayd/replayd/internal/sseparse"
)

// Three nodes as three OS processes (this test binary re-executed), each a
// hub on one PostgreSQL log with StartTail, its SSE handler and its poll
// handler (/poll) on 127.0.0.1, publishing from two goroutines; node 0
// prunes; node 1 is killed with SIGKILL mid-run and restarted. Clients in
// this process connect to the nodes and hop between them: over SSE with
// their Last-Event-ID, over polls passing their cursor back (some long
// polls, random limits, now and then an unknown_cursor probe), and some
// switching SSE → polls → SSE on one cursor. The nodes report every
// publish they attempt and every event Publish returned; a reader records
// the log as it grows. At the end the chaos oracle (chaostest.Check) checks
// every frame of every connection and every poll answer against that
// ledger and the log (the guarantee, over streams and polls, across nodes) and must find 0 violations;
// among its connections and poll sessions some resumed on another node
// than the one the client left, and went on exactly at the cursor.

const (
	nodeDSNEnv    = "REPLAYD_PG_NODE_DSN"    // run as a node on this DSN
	nodePrefixEnv = "REPLAYD_PG_NODE_PREFIX" // its table prefix
	nodeNameEnv   = "REPLAYD_PG_NODE_NAME"   // prefix of its event ids
	nodePruneEnv  = "REPLAYD_PG_NODE_PRUNE"  // "1": prune in a loop
	nodeKeep      = 600                      // the pruning node keeps the newest nodeKeep events
	nodeLimit     = 1000                     // the nodes' ReplayLimit
)

var nodesSeedFlag = flag.Uint64("nodes.seed", 0, "seed of TestNodesInProcesses's clients (0: from the clock)")

var nodeTopics = []string{"a", "b", "c", ""}

func TestNodesInProcesses(t *testing.T) {
	if dsn := os.Getenv(nodeDSNEnv); dsn != "" {
		runNode(dsn, os.Getenv(nodePrefixEnv), os.Getenv(nodeNameEnv), os.Getenv(nodePruneEnv) == "1")
		os.Exit(0)
	}
	dsn, prefix := testDSN(t), testPrefix(t)
	seed := *nodesSeedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -nodes.seed=%d)", seed, seed)
	tr := newTruth(seed)
	began := tr.timeline.Start
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The parent's store records the log as it grows, so rows pruned
	// before the end are still known.
	rec := openPrefixDSN(t, prefix, dsn)
	recDone := make(chan struct{})
	recStop := make(chan struct{})
	var recAfter int64
	recordOnce := func() error {
		for {
			evs, err := readAfter(ctx, rec, recAfter, 1000)
			if err != nil {
				return err
			}
			if len(evs) == 0 {
				return nil
			}
			for _, ev := range evs {
				tr.ledger.Logged(ev)
				tr.txs.logged(ev.EventID)
			}
			recAfter = evs[len(evs)-1].Sequence
		}
	}
	go func() {
		defer close(recDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-recStop:
				return
			case <-tick.C:
				if err := recordOnce(); err != nil {
					tr.fail("recorder: %v", err)
				}
			}
		}
	}()
	defer func() {
		select {
		case <-recStop:
		default:
			close(recStop)
		}
		<-recDone
	}()

	cl := &cluster{t: t, tr: tr, limit: nodeLimit}
	start := func(i, gen int) *nodeProc {
		name := fmt.Sprintf("n%dg%d", i, gen)
		p := startNode(t, tr, dsn, prefix, name, i == 0)
		select {
		case addr := <-p.addr:
			cl.setAddr(i, addr, gen)
			tr.timeline.Add("node " + name + " up")
		case <-time.After(20 * time.Second):
			t.Fatalf("node %d did not start within 20s: %s", i, p.Stderr())
		}
		return p
	}
	nodes := []*nodeProc{start(0, 1), start(1, 1), start(2, 1)}
	prunedOnce := nodes[0].prunedOnce

	// Clients: every scope shape, on every node, over SSE, over polls, and
	// switching transports (SSE, then polls, then SSE, ...) on one cursor;
	// some stay on node 1 until it dies, some join from cursor 0 once node
	// 0 has pruned (a pruned gap, then the retained events), the others
	// from the head.
	specs := []struct {
		scope            []string
		mode             clientMode
		fromZero, sticky bool
	}{
		{nil, overSSE, false, false}, {[]string{"a"}, overSSE, false, true}, {[]string{"a", "b"}, overSSE, true, false},
		{[]string{"c"}, overSSE, false, false}, {nil, overSSE, false, true}, {[]string{"b"}, overSSE, false, false},
		{[]string{"a"}, overSSE, false, false}, {nil, overSSE, true, false},
		{nil, overPoll, false, false}, {[]string{"a"}, overPoll, false, false}, {[]string{"b", "c"}, overPoll, false, false},
		{nil, overPoll, true, false}, {[]string{"c"}, overPoll, false, true},
		{[]string{"a"}, overBoth, false, false}, {nil, overBoth, false, false}, {[]string{"b"}, overBoth, true, false},
	}
	clients := make([]*nodeClient, len(specs))
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	var cwg sync.WaitGroup
	for i, sp := range specs {
		c := &nodeClient{name: fmt.Sprintf("client%d%s%v", i, sp.mode, sp.scope), scope: sp.scope, mode: sp.mode, node: i % 3, fromZero: sp.fromZero, sticky: sp.sticky}
		if c.sticky {
			c.node = 1
		}
		clients[i] = c
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			if c.fromZero {
				// Join from cursor 0 once node 0 has pruned: a pruned gap.
				select {
				case <-prunedOnce:
				case <-cctx.Done():
					return
				}
			}
			c.run(cctx, cl, tr, rand.New(rand.NewPCG(seed, uint64(i))))
		}()
	}
	defer func() { ccancel(); cwg.Wait() }()

	// Run (until node 0 has pruned, at least 2 s), kill node 1, restart
	// it, run on.
	sleepCtx(ctx, 2*time.Second)
	select {
	case <-prunedOnce:
	case <-time.After(20 * time.Second):
		t.Fatalf("node 0 pruned nothing within 20s: %s", nodes[0].Stderr())
	}
	nodes[1].Kill()
	nodes[1].Wait()
	cl.setAddr(1, "", 1)
	tr.timeline.Add("node n1g1 killed")
	killedAt := time.Now()
	nodes[1] = start(1, 2)
	t.Logf("node 1 killed at %v, back after %v", killedAt.Sub(began).Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
	sleepCtx(ctx, 3*time.Second)

	// Quiesce: every node stops publishing and says so; then every event
	// is committed, and the recorder reads the rest.
	for i, p := range nodes {
		io.WriteString(p.Stdin, "stop\n")
		select {
		case <-p.stopped:
		case <-time.After(20 * time.Second):
			t.Fatalf("node %d did not stop publishing within 20s: %s", i, p.Stderr())
		}
	}
	// The events of committed transactions still in the outbox reach the
	// log once the relays get to them.
	waitOutboxEmpty(t, ctx, testPoolDSN(t, dsn), prefix)
	close(recStop)
	<-recDone
	if err := recordOnce(); err != nil {
		t.Fatal(err)
	}
	pruned := nodes[0].prunedTotal()
	txCommitted, txRolledBack := tr.txs.check(tr)

	// Every client catches up with the newest event of its scope.
	deadline := time.Now().Add(20 * time.Second)
	for _, c := range clients {
		target := tr.last(c.scope)
		for c.cursorNow() < target {
			if time.Now().After(deadline) {
				t.Fatalf("%s reached %d, not %d, within 20s", c.name, c.cursorNow(), target)
			}
			sleepCtx(ctx, 20*time.Millisecond)
		}
	}
	ccancel()
	cwg.Wait()

	// The oracle, on the log as a hub of this process reads it.
	if errs := tr.errors(); len(errs) > 0 {
		t.Fatalf("%d failures, the first: %v", len(errs), errs[:min(len(errs), 10)])
	}
	h, err := replayd.NewWithStore(rec, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := tr.check(t, h, clients)
	h.Close()
	var killedResumes, onRestarted, probes, switches int
	for _, c := range clients {
		killedResumes += c.killed
		onRestarted += c.onRestarted
		probes += c.probes
		switches += c.switches
	}
	if pruned == 0 {
		t.Errorf("node 0 pruned nothing: the run did not exercise retention")
	}
	if killedResumes == 0 {
		t.Errorf("no client lost its stream to the kill")
	}
	if onRestarted == 0 {
		t.Errorf("no client connected to the restarted node")
	}
	if rep.ExactResumes == 0 {
		t.Errorf("no SSE client resumed on another node without a gap (%d resumes)", rep.Resumes)
	}
	if rep.Gaps["pruned"]+rep.Gaps["replay_limit"] == 0 {
		t.Errorf("no gap frame: the clients joining from cursor 0 after pruning got none")
	}
	if rep.PollGaps["pruned"] == 0 {
		t.Errorf("no poll answered a pruned gap: the poll client joining from cursor 0 after pruning got none")
	}
	if rep.PollExactResumes == 0 {
		t.Errorf("no poll client resumed on another node without a gap (%d resumes)", rep.PollResumes)
	}
	if probes == 0 || switches == 0 {
		t.Errorf("%d unknown_cursor probes, %d transport switches: want some of each", probes, switches)
	}
	if txCommitted == 0 || txRolledBack == 0 {
		t.Errorf("%d transactions with an event committed, %d rolled back: want some of each", txCommitted, txRolledBack)
	}
	t.Logf("%d events (of which %d published in committed transactions; %d more rolled back), head %d, %d pruned by node 0; %d SSE resumes on another node (%d exact, with events and no gap), %d poll sessions resumed on another node (%d exact); %d visits after the kill ended a stream, %d onto the restarted node; %d unknown_cursor probes, %d switches between SSE and polls; %v",
		rep.Published, txCommitted, txRolledBack, tr.head(), pruned, rep.Resumes, rep.ExactResumes, rep.PollResumes, rep.PollExactResumes,
		killedResumes, onRestarted, probes, switches, time.Since(began).Round(time.Millisecond))
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

// truth is what a multi-node test knows: the oracle's ledger (what the
// nodes' publishes returned or attempted, rows read from the log), the
// timeline of kills and restarts, and the test's own failures (a client
// that cannot go on, a node's unexpected output). The checks are the
// oracle's (check).
type truth struct {
	ledger   *chaostest.Ledger
	timeline *chaostest.Timeline
	seed     uint64
	ids      atomic.Int64 // record ids, for traces
	txs      txLedger

	mu   sync.Mutex
	errs []string
}

func newTruth(seed uint64) *truth {
	return &truth{ledger: chaostest.NewLedger(), timeline: chaostest.NewTimeline(), seed: seed,
		txs: txLedger{committed: map[string]bool{}, rolledBack: map[string]bool{}, inLog: map[string]int{}}}
}

// txLedger is what the nodes' transactional publishers reported (the
// oracle's ledger has them as attempts: an attempted event may or may not
// be in the log) and how often the recorder read each event id in the log.
type txLedger struct {
	mu                    sync.Mutex
	committed, rolledBack map[string]bool
	inLog                 map[string]int
}

func (l *txLedger) report(id string, committed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if committed {
		l.committed[id] = true
	} else {
		l.rolledBack[id] = true
	}
}

func (l *txLedger) logged(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inLog[id]++
}

// check holds the log, as the recorder read it, to the transactions: an
// event of a committed one read exactly once, of a rolled back one never.
func (l *txLedger) check(tr *truth) (committed, rolledBack int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.committed {
		if n := l.inLog[id]; n != 1 {
			tr.fail("the event %s of a committed transaction is in the log %d times", id, n)
		}
	}
	for id := range l.rolledBack {
		if n := l.inLog[id]; n != 0 {
			tr.fail("the event %s of a rolled back transaction is in the log", id)
		}
	}
	return len(l.committed), len(l.rolledBack)
}

// add records a row of the log the test has verified itself (crashLog: its
// type, topic and payload follow from its event id, which a node tried to
// publish), acknowledged at its sequence or not: the oracle takes it as
// published.
func (tr *truth) add(ev replayd.Event, acked bool) {
	if acked {
		tr.ledger.Published(ev)
		return
	}
	tr.ledger.Attempted(ev)
	tr.ledger.Logged(ev)
}

func (tr *truth) fail(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.errs = append(tr.errs, fmt.Sprintf(format, args...))
}

func (tr *truth) errors() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.errs)
}

// last returns the newest sequence known committed that scope sees.
func (tr *truth) last(scope []string) int64 { return tr.ledger.Last(scope) }

func (tr *truth) head() int64 { return tr.last(nil) }

// check hands the ledger, the log as h reads it now and every client's
// records to the chaos oracle; it reports the violations (with traces)
// and what was checked, and returns the report.
func (tr *truth) check(t *testing.T, h *replayd.EventHub, clients []*nodeClient) *chaostest.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, mark, err := chaostest.ReadLog(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	head, err := h.LatestSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := chaostest.Input{Ledger: tr.ledger, Log: rows, Mark: mark, Head: head, Seed: tr.seed, Timeline: tr.timeline}
	for _, c := range clients {
		c.mu.Lock()
		in.Conns = append(in.Conns, c.conns...)
		in.Polls = append(in.Polls, c.sessions...)
		c.mu.Unlock()
	}
	rep := chaostest.Check(in)
	for i, msg := range rep.Violations {
		if i == 8 {
			t.Errorf("... and %d more violations", len(rep.Violations)-i)
			break
		}
		t.Errorf("%s", msg)
	}
	rep.Log(t)
	if n := len(rep.Violations); n > 0 {
		t.Errorf("the chaos oracle found %d violations; seed %d", n, tr.seed)
	}
	return rep
}

// cluster is the nodes' current addresses ("" while one is down) and what
// the oracle knows of each.
type cluster struct {
	t       *testing.T
	tr      *truth
	limit   int  // the nodes' ReplayLimit
	outages bool // the database may be down: a node may answer 503
	mu      sync.Mutex
	addrs   [3]string
	gens    [3]int
	servers [3]*chaostest.Server
}

func (cl *cluster) setAddr(i int, addr string, gen int) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.addrs[i], cl.gens[i] = addr, gen
	cl.servers[i] = &chaostest.Server{Name: fmt.Sprintf("n%dg%d", i, gen), ReplayLimit: cl.limit, Unavailable: cl.outages}
}

func (cl *cluster) addr(i int) (string, int, *chaostest.Server) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.addrs[i], cl.gens[i], cl.servers[i]
}

// clientMode is how a nodeClient reads: SSE, polls, or SSE and polls by
// turns, one transport per node it visits, on one cursor.
type clientMode string

const (
	overSSE  clientMode = "sse"
	overPoll clientMode = "poll"
	overBoth clientMode = "both"
)

// nodeClient is a client hopping between nodes, over SSE, polls or both,
// recording every connection and poll for the oracle.
type nodeClient struct {
	name     string
	scope    []string
	mode     clientMode
	node     int  // the node it is on, or tries next
	fromZero bool // first connection sends Last-Event-ID 0
	sticky   bool // leaves its node only when the stream ends
	outages  bool // the database may be down: a poll's 503 sends it to another node

	mu        sync.Mutex
	connected bool            // it holds a cursor: a hello, an event or an answer gave it
	cursor    int64           // as an EventSource keeps it: the last id received
	last      chaostest.Visit // the visit that gave it its cursor
	conns     []*chaostest.Conn
	sessions  []*chaostest.PollSession

	resumes     int // visits after the first (always on another node)
	killed      int // resumes after a visit the client did not end
	onRestarted int // visits to a node's second generation
	probes      int // unknown_cursor probes answered
	switches    int // visits whose transport differed from the previous visit's
}

func (c *nodeClient) cursorNow() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cursor
}

// run connects, reads, and hops to another node until ctx ends: a
// non-sticky client leaves after a random 300-1200 ms; any client leaves
// when its stream ends (its node was killed).
func (c *nodeClient) run(ctx context.Context, cl *cluster, tr *truth, rng *rand.Rand) {
	lostStream := false
	for visit := 0; ctx.Err() == nil; {
		base, gen, srv := cl.addr(c.node)
		if base == "" {
			c.node = (c.node + 1) % 3
			sleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		life := time.Hour
		if !c.sticky {
			life = time.Duration(300+rng.IntN(900)) * time.Millisecond
		}
		var (
			ours bool
			err  error
		)
		if c.mode == overPoll || (c.mode == overBoth && visit%2 == 1) {
			ours, err = c.pollFor(ctx, srv, base, gen, life, lostStream, tr, rng)
		} else {
			ours, err = c.connect(ctx, srv, base, gen, life, lostStream, tr)
		}
		if c.mode == overBoth && visit > 0 {
			c.mu.Lock()
			c.switches++
			c.mu.Unlock()
		}
		visit++
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			tr.fail("%s on node %d: %v", c.name, c.node, err)
			return
		}
		lostStream = !ours
		c.node = (c.node + 1 + rng.IntN(2)) % 3 // another node
	}
}

// visit counts a visit that was answered: a resume (after a stream the
// client did not end, or not) and a visit to a node's second generation.
func (c *nodeClient) visit(resuming, afterLoss bool, gen int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if resuming {
		c.resumes++
		if afterLoss {
			c.killed++
		}
	}
	if gen == 2 {
		c.onRestarted++
	}
}

// connect runs one SSE connection for at most life, recording it; it
// returns whether the client ended it (false: the server or the network
// did). err is for what ends the client.
func (c *nodeClient) connect(ctx context.Context, srv *chaostest.Server, base string, gen int, life time.Duration, afterLoss bool, tr *truth) (ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	c.mu.Lock()
	resuming := c.connected
	rec := &chaostest.Conn{Server: srv, Topics: c.scope, ID: int(tr.ids.Add(1)), Client: c.name, Mode: "fresh", Via: "header",
		Behaviour: map[bool]string{false: "hop", true: "sticky"}[c.sticky], Start: tr.timeline.Since(), Known: tr.ledger.Max()}
	switch {
	case resuming:
		rec.Mode, rec.Sent, rec.After = "resume", strconv.FormatInt(c.cursor, 10), c.last
	case c.fromZero:
		rec.Mode, rec.Sent = "zero", "0"
	}
	c.conns = append(c.conns, rec)
	c.mu.Unlock()
	defer func() { rec.Stop = tr.timeline.Since() }()

	req, err := http.NewRequestWithContext(cctx, http.MethodGet, base+"/?"+url.Values{"topic": c.scope}.Encode(), nil)
	if err != nil {
		return false, err
	}
	if rec.Sent != "" {
		req.Header.Set("Last-Event-ID", rec.Sent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		rec.End = "no response: " + err.Error()
		return cctx.Err() != nil, nil // refused (the node is dying): try another
	}
	defer resp.Body.Close()
	rec.Status, rec.Chunked = resp.StatusCode, slices.Contains(resp.TransferEncoding, "chunked")
	if resp.StatusCode != http.StatusOK {
		rec.End = "status " + resp.Status
		if c.outages && resp.StatusCode == http.StatusServiceUnavailable {
			return false, nil
		}
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	c.visit(resuming, afterLoss, gen)

	frames := make(chan chaostest.Frame, 64)
	perr := make(chan error, 1)
	go func() {
		perr <- chaostest.ReadFrames(resp.Body, frames)
		close(frames)
	}()
	for f := range frames {
		rec.Add(f)
		if seq, err := strconv.ParseInt(f.ID, 10, 64); f.HasID && err == nil {
			c.mu.Lock()
			c.connected, c.cursor, c.last = true, seq, rec
			c.mu.Unlock()
		}
	}
	rec.End = fmt.Sprintf("stream ended (%v)", <-perr)
	if cctx.Err() != nil {
		rec.End = "client left"
	}
	return cctx.Err() != nil, nil
}

// pollFor polls one node for at most life, passing the cursor back each
// time, as one recorded session; it returns whether the client ended the
// visit (false: a request failed, the node is down). err is for what ends
// the client.
func (c *nodeClient) pollFor(ctx context.Context, srv *chaostest.Server, base string, gen int, life time.Duration, afterLoss bool, tr *truth, rng *rand.Rand) (ours bool, err error) {
	end := time.Now().Add(life)
	if rng.IntN(4) == 0 {
		if !c.probe(ctx, srv, base, tr) {
			return ctx.Err() != nil, nil
		}
	}
	c.mu.Lock()
	resuming := c.connected
	s := &chaostest.PollSession{Server: srv, Topics: c.scope, ID: int(tr.ids.Add(1)), Client: c.name, Mode: "fresh"}
	switch {
	case resuming:
		s.Mode, s.After = "resume", c.last
	case c.fromZero:
		s.Mode = "zero"
	}
	c.sessions = append(c.sessions, s)
	c.mu.Unlock()
	first, idle := true, false
	for time.Now().Before(end) {
		if ctx.Err() != nil {
			s.End = "client stopped"
			return true, nil
		}
		c.mu.Lock()
		connected, cursor := c.connected, c.cursor
		c.mu.Unlock()
		p := &chaostest.Poll{Limit: 1 + rng.IntN(200), Known: tr.ledger.Max()}
		q := url.Values{"topic": c.scope}
		if connected || c.fromZero {
			p.Sent = strconv.FormatInt(cursor, 10)
			q.Set("cursor", p.Sent)
			if idle || rng.IntN(2) == 0 {
				p.Wait = 500 * time.Millisecond // held until an event of the scope is committed on any node
				q.Set("wait", "0.5")
			}
		}
		q.Set("limit", strconv.Itoa(p.Limit))
		s.Polls = append(s.Polls, p)
		status, ok, err := getPoll(ctx, base+"/poll?"+q.Encode(), p, tr)
		if err != nil {
			s.End = err.Error()
			return ctx.Err() != nil, nil // the node is dying: try another
		}
		if !ok {
			s.End = fmt.Sprintf("status %d", status)
			if c.outages && status == http.StatusServiceUnavailable {
				return false, nil // its database is down: try another node
			}
			return false, fmt.Errorf("poll on %s: %s", base, s.End)
		}
		if first {
			first = false
			c.visit(resuming, afterLoss, gen)
		}
		c.mu.Lock()
		c.connected, c.cursor, c.last = true, p.Cursor(), s
		c.mu.Unlock()
		idle = p.Events() == 0 && p.Gap() == ""
	}
	s.End = "visit over"
	return true, nil
}

// probe sends one poll with a cursor far above any head, as a session of
// its own: the poll transport answers an unknown_cursor gap with the head as the
// cursor and no events. The client's cursor does not move. It returns
// false when the request failed (the node is dying).
func (c *nodeClient) probe(ctx context.Context, srv *chaostest.Server, base string, tr *truth) bool {
	known := tr.ledger.Max()
	p := &chaostest.Poll{Sent: strconv.FormatInt(known+1e12, 10), Limit: 50, Known: known}
	s := &chaostest.PollSession{Server: srv, Topics: c.scope, ID: int(tr.ids.Add(1)), Client: c.name, Mode: "future", End: "probe", Polls: []*chaostest.Poll{p}}
	c.mu.Lock()
	c.sessions = append(c.sessions, s)
	c.mu.Unlock()
	q := url.Values{"topic": c.scope, "cursor": {p.Sent}, "limit": {strconv.Itoa(p.Limit)}}
	if _, ok, err := getPoll(ctx, base+"/poll?"+q.Encode(), p, tr); err != nil || !ok {
		return false
	}
	c.mu.Lock()
	c.probes++
	c.mu.Unlock()
	return true
}

// getPoll sends one poll, for at most 10 s, and records it in p. ok
// reports a well-formed 200 answer; err a request that failed or a body
// cut short (the node was killed), which leaves p without a status.
func getPoll(ctx context.Context, u string, p *chaostest.Poll, tr *truth) (status int, ok bool, err error) {
	p.Start = tr.timeline.Since()
	defer func() { p.Stop = tr.timeline.Since() }()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false, err
	}
	p.Record(resp.StatusCode, resp.Header.Get("Retry-After"), body)
	return resp.StatusCode, p.OK(), nil
}

// sseFrame is one dispatched SSE frame.
type sseFrame struct{ id, event, data string }

// readSSE parses an SSE stream into frames until it ends, then closes out.
// Frames with neither an event type nor data (a lone retry) are skipped.
func readSSE(r io.Reader, out chan<- sseFrame) error {
	defer close(out)
	sr := sseparse.NewReader(r)
	for {
		f, err := sr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(f.Event) == 0 && len(f.Data) == 0 {
			continue
		}
		out <- sseFrame{id: string(f.ID), event: string(f.Event), data: string(f.Data)}
	}
}

// runNode is the child: a hub on the log with StartTail and its SSE
// handler on 127.0.0.1, two publishers, and (with prune) a retention loop.
// It prints "addr <url>", "try <event as JSON>" before each publish and
// "ack <event as JSON>" with what it returned, "pruned <n>" per prune that
// deleted rows, and "stopped" once it has stopped publishing after reading
// "stop" on stdin. It exits when stdin ends.
func runNode(dsn, prefix, name string, prune bool) {
	die := func(code int, err error) {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(code)
	}
	ctx := context.Background()
	s, err := Open(ctx, dsn, WithTablePrefix(prefix))
	if err != nil {
		die(2, err)
	}
	hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: nodeLimit, HeartbeatInterval: -1}})
	if err != nil {
		die(2, err)
	}
	if _, err := hub.StartTail(500*time.Millisecond, replayd.TailOptions{}); err != nil {
		die(2, err)
	}
	say, err := childServe(hub)
	if err != nil {
		die(2, err)
	}

	quit := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(8 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-quit:
					return
				case <-tick.C:
				}
				topic := nodeTopics[(n+w)%len(nodeTopics)]
				id := fmt.Sprintf("%s-w%d-%d", name, w, n)
				payload, _ := json.Marshal(map[string]string{"id": id, "topic": topic})
				try, _ := json.Marshal(replayd.Event{EventID: id, Type: "message", Topic: topic, Payload: payload})
				say("try %s", try)
				ev, err := hub.Publish(ctx, topic, json.RawMessage(payload), replayd.WithEventID(id))
				if err != nil {
					die(3, err)
				}
				ack, _ := json.Marshal(ev)
				say("ack %s", ack)
			}
		}()
	}
	// A transactional publisher: every 20 ms a transaction of the
	// application's (pgx's or database/sql's, by turns) publishes an event
	// and commits, or, one time in four, rolls back. A commit is reported
	// as an attempt before it ("try") and "txok" after; a rollback
	// "txrb", and never as an attempt: its event must never appear.
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		die(2, err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		die(2, err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			topic := nodeTopics[n%len(nodeTopics)]
			id := fmt.Sprintf("%s-tx-%d", name, n)
			commit := n%4 != 3
			payload, _ := json.Marshal(map[string]string{"id": id, "topic": topic})
			if commit {
				try, _ := json.Marshal(replayd.Event{EventID: id, Type: "message", Topic: topic, Payload: payload})
				say("try %s", try)
			}
			var err error
			if n%2 == 0 {
				err = txPublish(ctx, pool, nil, s, topic, payload, id, commit)
			} else {
				err = txPublish(ctx, nil, db, s, topic, payload, id, commit)
			}
			if err != nil {
				die(3, err)
			}
			if commit {
				say("txok %s", id)
			} else {
				say("txrb %s", id)
			}
		}
	}()
	if prune {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-quit:
					return
				case <-tick.C:
				}
				n, err := hub.Prune(ctx, replayd.RetentionPolicy{MaxEvents: nodeKeep})
				if err != nil {
					die(3, err)
				}
				if n > 0 {
					say("pruned %d", n)
				}
			}
		}()
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "stop" {
			close(quit)
			wg.Wait()
			say("stopped")
		}
	}
	os.Exit(0) // the parent is done (or gone): no graceful close needed
}

// txPublish publishes an event in a transaction of pool (pgx) or, if
// pool is nil, of db (database/sql), and commits it or rolls it back.
func txPublish(ctx context.Context, pool *pgxpool.Pool, db *sql.DB, s *Store, topic string, payload json.RawMessage, id string, commit bool) error {
	if pool != nil {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := s.PublishTx(ctx, tx, topic, payload, replayd.WithEventID(id)); err != nil {
			return err
		}
		if commit {
			return tx.Commit(ctx)
		}
		return tx.Rollback(ctx)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := s.PublishSQLTx(ctx, tx, topic, payload, replayd.WithEventID(id)); err != nil {
		return err
	}
	if commit {
		return tx.Commit()
	}
	return tx.Rollback()
}

// nodeProc is a node process (see internal/childproc).
type nodeProc struct {
	*childproc.Proc
	addr    chan string
	stopped chan struct{}
	// prunedOnce is closed at the first prune that deleted rows.
	prunedOnce chan struct{}

	mu     sync.Mutex
	pruned int64
}

func (p *nodeProc) prunedTotal() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pruned
}

// startNode re-executes the test binary as a node; its attempts and
// acknowledgements go to tr's ledger as they arrive.
func startNode(t *testing.T, tr *truth, dsn, prefix, name string, prune bool) *nodeProc {
	t.Helper()
	env := []string{nodeDSNEnv + "=" + dsn, nodePrefixEnv + "=" + prefix, nodeNameEnv + "=" + name}
	if prune {
		env = append(env, nodePruneEnv+"=1")
	}
	p := &nodeProc{addr: make(chan string, 1), stopped: make(chan struct{}), prunedOnce: make(chan struct{})}
	p.Proc = childproc.Start(t, "TestNodesInProcesses", func(stdout io.Reader) {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "addr":
				p.addr <- f[1]
			case len(f) == 2 && (f[0] == "try" || f[0] == "ack"):
				var ev replayd.Event
				if err := json.Unmarshal([]byte(f[1]), &ev); err != nil {
					tr.fail("%s: %q: %v", name, sc.Text(), err)
					continue
				}
				if f[0] == "try" {
					tr.ledger.Attempted(ev)
				} else {
					tr.ledger.Published(ev)
				}
			case len(f) == 2 && (f[0] == "txok" || f[0] == "txrb"):
				tr.txs.report(f[1], f[0] == "txok")
			case len(f) == 2 && f[0] == "pruned":
				n, _ := strconv.ParseInt(f[1], 10, 64)
				p.mu.Lock()
				if p.pruned == 0 {
					close(p.prunedOnce)
				}
				p.pruned += n
				p.mu.Unlock()
				tr.timeline.Add(fmt.Sprintf("node %s pruned %d rows", name, n))
			case len(f) == 1 && f[0] == "stopped":
				close(p.stopped)
			default:
				tr.fail("%s: unexpected line %q", name, sc.Text())
			}
		}
	}, env...)
	return p
}
