package replaydpg

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/childproc"
	"github.com/replayd/replayd/internal/sseparse"
)

// Three nodes as three OS processes (this test binary re-executed), each a
// hub on one PostgreSQL log with StartTail, its SSE handler and its poll
// handler (/poll) on 127.0.0.1, publishing from two goroutines; node 0
// prunes; node 1 is killed with SIGKILL mid-run and restarted. Clients in
// this process connect to the nodes and hop between them: over SSE with
// their Last-Event-ID, over polls passing their cursor back (some long
// polls, random limits), and some switching SSE → polls → SSE on one
// cursor. At the end every client must have received every event visible
// to its scope above its starting cursor exactly once, in order, or inside
// a gap's range (SPEC §1, §11, §14), and every resume on a node other than
// the one the client left must continue exactly at its cursor; every poll
// answer is checked as it arrives (SPEC §11: pruned gaps from cursor+1,
// cursor and more, a head no older than what was committed before the
// request, unknown_cursor for a cursor above the head).

const (
	nodeDSNEnv    = "REPLAYD_PG_NODE_DSN"    // run as a node on this DSN
	nodePrefixEnv = "REPLAYD_PG_NODE_PREFIX" // its table prefix
	nodeNameEnv   = "REPLAYD_PG_NODE_NAME"   // prefix of its event ids
	nodePruneEnv  = "REPLAYD_PG_NODE_PRUNE"  // "1": prune in a loop
	nodeKeep      = 600                      // the pruning node keeps the newest nodeKeep events
)

var nodeTopics = []string{"a", "b", "c", ""}

func TestNodesInProcesses(t *testing.T) {
	if dsn := os.Getenv(nodeDSNEnv); dsn != "" {
		runNode(dsn, os.Getenv(nodePrefixEnv), os.Getenv(nodeNameEnv), os.Getenv(nodePruneEnv) == "1")
		os.Exit(0)
	}
	dsn, prefix := testDSN(t), testPrefix(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The parent's store records the log as it grows, so rows pruned
	// before the end are still known.
	rec := openPrefixDSN(t, prefix, dsn)
	tr := &truth{rows: map[int64]nodeRow{}}
	recDone := make(chan struct{})
	recStop := make(chan struct{})
	var recAfter int64
	recordOnce := func() error {
		for {
			evs, err := rec.ReadAfter(ctx, recAfter, 1000)
			if err != nil {
				return err
			}
			if len(evs) == 0 {
				return nil
			}
			for _, ev := range evs {
				tr.add(ev.Sequence, ev.EventID, ev.Topic, "log")
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

	cl := &cluster{t: t, tr: tr}
	start := func(i, gen int) *nodeProc {
		p := startNode(t, tr, dsn, prefix, fmt.Sprintf("n%dg%d", i, gen), i == 0)
		select {
		case addr := <-p.addr:
			cl.setAddr(i, addr, gen)
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
			c.run(cctx, cl, tr, rand.New(rand.NewPCG(uint64(i), uint64(began.UnixNano()))))
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
	close(recStop)
	<-recDone
	if err := recordOnce(); err != nil {
		t.Fatal(err)
	}
	pruned := nodes[0].prunedTotal()

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

	// The oracle.
	if errs := tr.errors(); len(errs) > 0 {
		t.Fatalf("%d violations, the first: %v", len(errs), errs[:min(len(errs), 10)])
	}
	var resumes, exact, gaps, killedResumes, onRestarted int
	var polls, pollEvents, sseEvents, pollGaps, pollExact, probes, switches int
	for _, c := range clients {
		c.check(t, tr)
		resumes += c.resumes
		exact += c.exact
		gaps += len(c.gaps)
		killedResumes += c.killed
		onRestarted += c.onRestarted
		polls += c.polls
		pollEvents += c.pollEvents
		sseEvents += len(c.seqs) - c.pollEvents
		pollGaps += c.pollGaps
		pollExact += c.pollExact
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
	if exact == 0 {
		t.Errorf("no client resumed on another node without a gap (%d resumes)", resumes)
	}
	if gaps == 0 {
		t.Errorf("no gap frame: the clients joining from cursor 0 after pruning got none")
	}
	if pollGaps == 0 {
		t.Errorf("no poll answered a pruned gap: the poll client joining from cursor 0 after pruning got none")
	}
	if pollExact == 0 {
		t.Errorf("no poll client resumed on another node without a gap")
	}
	if probes == 0 || switches == 0 {
		t.Errorf("%d unknown_cursor probes, %d transport switches: want some of each", probes, switches)
	}
	t.Logf("%d events (%d acknowledged), head %d, %d pruned by node 0; %d resumes on another node (%d exact with no gap, %d after the kill, %d onto the restarted node), %d gaps; %d events checked over SSE, %d over %d polls (%d exact poll resumes, %d pruned gaps by poll, %d unknown_cursor probes), %d switches between SSE and polls; %v",
		tr.count(), tr.acked(), tr.head(), pruned, resumes, exact, killedResumes, onRestarted, gaps,
		sseEvents, pollEvents, polls, pollExact, pollGaps, probes, switches, time.Since(began).Round(time.Millisecond))
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

// nodeRow is what is known of one sequence: its event id and topic.
type nodeRow struct {
	id, topic string
	acked     bool
}

// truth gathers every committed event from every source (acknowledgements,
// the recorder's reads, the clients' frames) and the violations found.
type truth struct {
	mu   sync.Mutex
	rows map[int64]nodeRow
	max  int64 // the highest sequence known committed
	errs []string
}

func (tr *truth) add(seq int64, id, topic, source string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	r, ok := tr.rows[seq]
	if ok && (r.id != id || r.topic != topic) {
		tr.errs = append(tr.errs, fmt.Sprintf("sequence %d is %s/%q to %s, but %s/%q elsewhere", seq, id, topic, source, r.id, r.topic))
		return
	}
	r.id, r.topic = id, topic
	r.acked = r.acked || source == "ack"
	tr.rows[seq] = r
	tr.max = max(tr.max, seq)
}

// known returns the highest sequence known to be committed: a head read
// after it must be at least this.
func (tr *truth) known() int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.max
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

// visible returns the sequences visible to scope, ascending.
func (tr *truth) visible(scope []string) []int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []int64
	for seq, r := range tr.rows {
		if scopeSees(scope, r.topic) {
			out = append(out, seq)
		}
	}
	slices.Sort(out)
	return out
}

func (tr *truth) last(scope []string) int64 {
	v := tr.visible(scope)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)-1]
}

func (tr *truth) head() int64 { return tr.last(nil) }

func (tr *truth) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.rows)
}

func (tr *truth) acked() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, r := range tr.rows {
		if r.acked {
			n++
		}
	}
	return n
}

func scopeSees(scope []string, topic string) bool {
	return len(scope) == 0 || topic == "" || slices.Contains(scope, topic)
}

// cluster is the nodes' current addresses ("" while one is down).
type cluster struct {
	t     *testing.T
	tr    *truth
	mu    sync.Mutex
	addrs [3]string
	gens  [3]int
}

func (cl *cluster) setAddr(i int, addr string, gen int) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.addrs[i], cl.gens[i] = addr, gen
}

func (cl *cluster) addr(i int) (string, int) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.addrs[i], cl.gens[i]
}

// clientMode is how a nodeClient reads: SSE, polls, or SSE and polls by
// turns, one transport per node it visits, on one cursor.
type clientMode string

const (
	overSSE  clientMode = "sse"
	overPoll clientMode = "poll"
	overBoth clientMode = "both"
)

// nodeClient is a client hopping between nodes, over SSE, polls or both.
type nodeClient struct {
	name     string
	scope    []string
	mode     clientMode
	node     int  // the node it is on, or tries next
	fromZero bool // first connection sends Last-Event-ID 0
	sticky   bool // leaves its node only when the stream ends
	outages  bool // the database may be down: a poll's 503 sends it to another node

	mu          sync.Mutex
	connected   bool // a first hello was read
	start       int64
	cursor      int64
	seqs        []int64
	gaps        [][2]int64 // missedFrom, missedThrough
	resumes     int        // connections after the first (always on another node)
	killed      int        // resumes after a stream the client did not end
	onRestarted int        // connections to a node's second generation
	exact       int        // resumes on another node that went on at the cursor with no gap

	polls      int // poll answers checked
	pollEvents int // events received by poll (the rest of seqs by SSE)
	pollGaps   int // pruned gaps answered to polls
	pollExact  int // poll resumes on another node that went on at the cursor with no gap
	probes     int // unknown_cursor probes answered as SPEC §11 says
	switches   int // visits whose transport differed from the previous visit's
}

func (c *nodeClient) cursorNow() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cursor
}

// countVisit counts a visit that was answered: a resume (after a stream
// the client did not end, or not) and a visit to a node's second
// generation. c.mu is held.
func (c *nodeClient) countVisit(resuming, afterLoss bool, gen int) {
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

// run connects, reads, and hops to another node until ctx ends: a
// non-sticky client leaves after a random 300-1200 ms; any client leaves
// when its stream ends (its node was killed).
func (c *nodeClient) run(ctx context.Context, cl *cluster, tr *truth, rng *rand.Rand) {
	lostStream := false
	for visit := 0; ctx.Err() == nil; {
		base, gen := cl.addr(c.node)
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
			ours, err = c.pollFor(ctx, base, gen, life, lostStream, tr, rng)
		} else {
			ours, err = c.connect(ctx, base, gen, life, lostStream, tr)
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

// connect runs one SSE connection for at most life; it returns whether the
// client ended it (false: the server or the network did). Protocol
// violations go to tr; err is for what ends the client.
func (c *nodeClient) connect(ctx context.Context, base string, gen int, life time.Duration, afterLoss bool, tr *truth) (ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, base+"/?"+url.Values{"topic": c.scope}.Encode(), nil)
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	resuming := c.connected
	cursor := c.cursor
	c.mu.Unlock()
	if resuming || c.fromZero {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(cursor, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return cctx.Err() != nil, nil // refused (the node is dying): try another
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	c.mu.Lock()
	c.countVisit(resuming, afterLoss, gen)
	c.mu.Unlock()

	frames := make(chan sseFrame, 64)
	perr := make(chan error, 1)
	go func() { perr <- readSSE(resp.Body, frames) }()
	hello, gapped, counted := true, false, false
	for f := range frames {
		switch {
		case hello:
			hello = false
			var d struct{ Cursor, Head int64 }
			if f.event != "hello" || json.Unmarshal([]byte(f.data), &d) != nil {
				tr.fail("%s: first frame %+v, want hello", c.name, f)
				continue
			}
			c.mu.Lock()
			if !c.connected {
				c.connected, c.start, c.cursor = true, d.Cursor, d.Cursor
				if c.fromZero && d.Cursor != 0 {
					tr.fail("%s: hello cursor %d, sent 0", c.name, d.Cursor)
				}
			} else if d.Cursor != c.cursor {
				tr.fail("%s: resumed on %s with cursor %d, hello says %d", c.name, base, c.cursor, d.Cursor)
			}
			c.mu.Unlock()
		case f.event == "gap":
			var g struct {
				Reason                    string
				ResumedFrom               *int64
				MissedFrom, MissedThrough *int64
			}
			if err := json.Unmarshal([]byte(f.data), &g); err != nil || g.MissedFrom == nil || g.MissedThrough == nil || (g.Reason != "pruned" && g.Reason != "replay_limit") {
				tr.fail("%s on %s: gap %s", c.name, base, f.data)
				continue
			}
			c.mu.Lock()
			if *g.MissedFrom <= c.cursor {
				tr.fail("%s on %s: gap %s reaches below the cursor %d", c.name, base, f.data, c.cursor)
			}
			c.gaps = append(c.gaps, [2]int64{*g.MissedFrom, *g.MissedThrough})
			gapped = true
			c.mu.Unlock()
		case f.event == "message":
			seq, err := strconv.ParseInt(f.id, 10, 64)
			var p struct{ ID, Topic string }
			if err != nil || json.Unmarshal([]byte(f.data), &p) != nil {
				tr.fail("%s: bad frame %+v", c.name, f)
				continue
			}
			tr.add(seq, p.ID, p.Topic, c.name)
			c.mu.Lock()
			switch {
			case seq <= c.cursor:
				tr.fail("%s on %s: event %d at cursor %d (out of order or repeated)", c.name, base, seq, c.cursor)
			case !scopeSees(c.scope, p.Topic):
				tr.fail("%s on %s: event %d of topic %q is outside its scope", c.name, base, seq, p.Topic)
			case len(c.gaps) > 0 && c.gaps[len(c.gaps)-1][1] >= seq:
				tr.fail("%s on %s: event %d inside the gap %v it follows", c.name, base, seq, c.gaps[len(c.gaps)-1])
			}
			if resuming && !gapped && !counted {
				c.exact++ // the check proves nothing visible was skipped
				counted = true
			}
			c.seqs = append(c.seqs, seq)
			c.cursor = max(c.cursor, seq)
			c.mu.Unlock()
		case f.event == "heartbeat":
		default:
			tr.fail("%s: unexpected frame %+v", c.name, f)
		}
	}
	<-perr
	return cctx.Err() != nil, nil
}

// pollFor polls one node for at most life, passing the cursor back each
// time; it returns whether the client ended the visit (false: a request
// failed, the node is down). Every answer is checked against SPEC §11 and
// the truth; violations go to tr; err is for what ends the client.
func (c *nodeClient) pollFor(ctx context.Context, base string, gen int, life time.Duration, afterLoss bool, tr *truth, rng *rand.Rand) (ours bool, err error) {
	end := time.Now().Add(life)
	first, idle, gapped, counted := true, false, false, false
	c.mu.Lock()
	resuming := c.connected
	c.mu.Unlock()
	if rng.IntN(4) == 0 {
		if !c.probe(ctx, base, tr) {
			return ctx.Err() != nil, nil
		}
	}
	for time.Now().Before(end) {
		if ctx.Err() != nil {
			return true, nil
		}
		c.mu.Lock()
		connected, cursor := c.connected, c.cursor
		c.mu.Unlock()
		fresh := !connected && !c.fromZero
		q := url.Values{"topic": c.scope}
		if !fresh {
			q.Set("cursor", strconv.FormatInt(cursor, 10))
		}
		limit := 1 + rng.IntN(200)
		q.Set("limit", strconv.Itoa(limit))
		if !fresh && (idle || rng.IntN(2) == 0) {
			q.Set("wait", "0.5") // held until an event of the scope is committed on any node
		}
		known := tr.known()
		ans, err := getPoll(ctx, base+"/poll?"+q.Encode())
		if err != nil {
			if ctx.Err() != nil {
				return true, nil
			}
			if errors.Is(err, errPollStatus) && !(c.outages && errors.Is(err, errPoll503)) {
				return false, err
			}
			return false, nil // the node is dying, or its database is down: try another
		}
		c.mu.Lock()
		c.polls++
		if first {
			first = false
			c.countVisit(resuming, afterLoss, gen)
		}
		bad := func(format string, args ...any) {
			tr.fail("%s poll on %s at cursor %d: %s", c.name, base, cursor, fmt.Sprintf(format, args...))
		}
		if ans.Head < known {
			bad("head %d, but %d was committed before the request", ans.Head, known)
		}
		if len(ans.Events) > limit {
			bad("%d events for limit %d", len(ans.Events), limit)
		}
		if ans.More && len(ans.Events) < limit {
			bad("more with %d events for limit %d", len(ans.Events), limit)
		}
		after := cursor // events must be above it
		switch {
		case fresh:
			if ans.Gap != nil || len(ans.Events) > 0 || ans.Cursor != ans.Head {
				bad("fresh poll answered gap %+v, %d events, cursor %d, head %d", ans.Gap, len(ans.Events), ans.Cursor, ans.Head)
			}
			c.connected, c.start, c.cursor = true, ans.Cursor, ans.Cursor
			c.mu.Unlock()
			continue
		case ans.Gap == nil:
		case ans.Gap.Reason == "pruned":
			g := ans.Gap
			if g.ResumedFrom == nil || *g.ResumedFrom != cursor || g.MissedFrom == nil || *g.MissedFrom != cursor+1 ||
				g.MissedThrough == nil || *g.MissedThrough <= cursor || g.Missed != nil {
				bad("pruned gap %s", g)
				break
			}
			c.gaps = append(c.gaps, [2]int64{*g.MissedFrom, *g.MissedThrough})
			c.pollGaps++
			gapped = true
			after = *g.MissedThrough
		default:
			// unknown_cursor needs a cursor above the head: this one is a
			// sequence some node served, and replay_limit is not for polls.
			bad("gap %s", ans.Gap)
		}
		if !connected {
			c.connected, c.start = true, cursor
		}
		for _, e := range ans.Events {
			var p struct{ ID, Topic string }
			topic := ""
			if e.Topic != nil {
				topic = *e.Topic
			}
			if err := json.Unmarshal(e.Data, &p); err != nil || p.Topic != topic || e.Type != "message" {
				bad("bad event %d: type %q, topic %v, data %s", e.ID, e.Type, e.Topic, e.Data)
				continue
			}
			tr.add(e.ID, p.ID, p.Topic, c.name)
			switch {
			case e.ID <= after:
				bad("event %d not above %d (out of order, repeated or inside the gap)", e.ID, after)
			case !scopeSees(c.scope, p.Topic):
				bad("event %d of topic %q is outside its scope", e.ID, p.Topic)
			}
			after = max(after, e.ID)
			c.seqs = append(c.seqs, e.ID)
			c.pollEvents++
		}
		if n := len(ans.Events); n > 0 {
			if ans.Cursor != ans.Events[n-1].ID {
				bad("cursor %d, last event %d", ans.Cursor, ans.Events[n-1].ID)
			}
			if resuming && !gapped && !counted {
				c.pollExact++ // check proves nothing visible was skipped
				c.exact++
			}
			counted = true
		} else if ans.Cursor != cursor {
			bad("cursor %d with no events", ans.Cursor)
		}
		c.cursor = max(c.cursor, ans.Cursor)
		idle = len(ans.Events) == 0 && ans.Gap == nil
		c.mu.Unlock()
	}
	return true, nil
}

// probe sends one poll with a cursor far above any head: SPEC §11 answers
// an unknown_cursor gap with the head as the cursor and no events. The
// client's cursor does not move. It returns false when the request failed
// (the node is dying).
func (c *nodeClient) probe(ctx context.Context, base string, tr *truth) bool {
	bogus := tr.known() + 1e12
	known := tr.known()
	ans, err := getPoll(ctx, base+"/poll?"+url.Values{"topic": c.scope, "cursor": {strconv.FormatInt(bogus, 10)}}.Encode())
	if err != nil {
		if errors.Is(err, errPollStatus) && !(c.outages && errors.Is(err, errPoll503)) {
			tr.fail("%s probe on %s: %v", c.name, base, err)
		}
		return false
	}
	g := ans.Gap
	if g == nil || g.Reason != "unknown_cursor" || g.ResumedFrom == nil || *g.ResumedFrom != bogus ||
		g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil ||
		len(ans.Events) > 0 || ans.Cursor != ans.Head || ans.Head < known {
		tr.fail("%s probe on %s with cursor %d (known head %d): cursor %d, head %d, gap %s, %d events", c.name, base, bogus, known, ans.Cursor, ans.Head, g, len(ans.Events))
	}
	c.mu.Lock()
	c.probes++
	c.mu.Unlock()
	return true
}

// pollAnswer is a poll's JSON answer (SPEC §11).
type pollAnswer struct {
	Cursor, Head int64
	More         bool
	Gap          *pollGap
	Events       []struct {
		ID    int64
		Type  string
		Topic *string
		Data  json.RawMessage
	}
}

type pollGap struct {
	Reason                                         string
	ResumedFrom, MissedFrom, MissedThrough, Missed *int64
}

func (g *pollGap) String() string {
	if g == nil {
		return "null"
	}
	s := func(p *int64) string {
		if p == nil {
			return "null"
		}
		return strconv.FormatInt(*p, 10)
	}
	return fmt.Sprintf("{%s resumedFrom %s missed %s..%s (%s)}", g.Reason, s(g.ResumedFrom), s(g.MissedFrom), s(g.MissedThrough), s(g.Missed))
}

var (
	errPollStatus = errors.New("poll status")
	errPoll503    = errors.New("poll status 503")
)

// getPoll sends one poll, for at most 10 s. An answer other than 200 is
// errPollStatus; a failed request or a body cut short (the node was
// killed) is another error.
func getPoll(ctx context.Context, u string) (*pollAnswer, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusServiceUnavailable {
		return nil, fmt.Errorf("%w, %w: %s", errPollStatus, errPoll503, body)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w %d: %s", errPollStatus, resp.StatusCode, body)
	}
	var ans pollAnswer
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, fmt.Errorf("%w 200 with a body that is not an answer: %v: %.200s", errPollStatus, err, body)
	}
	return &ans, nil
}

// check: every event visible to the scope above the starting cursor and
// up to the client's cursor was received exactly once, in order, or lies
// inside a gap's range.
func (c *nodeClient) check(t *testing.T, tr *truth) {
	t.Helper()
	got := map[int64]bool{}
	for _, s := range c.seqs {
		got[s] = true
	}
	var missing []int64
	for _, seq := range tr.visible(c.scope) {
		if seq <= c.start || seq > c.cursor || got[seq] {
			continue
		}
		if !slices.ContainsFunc(c.gaps, func(g [2]int64) bool { return g[0] <= seq && seq <= g[1] }) {
			missing = append(missing, seq)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s (from %d, at %d, gaps %v): %d events neither received nor inside a gap, the first %v", c.name, c.start, c.cursor, c.gaps, len(missing), missing[:min(len(missing), 10)])
	}
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
// It prints "addr <url>", "ack <sequence> <id> <topic or ->" per publish
// that returned, "pruned <n>" per prune that deleted rows, and "stopped"
// once it has stopped publishing after reading "stop" on stdin. It exits
// when stdin ends.
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
	hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 1000, HeartbeatInterval: -1}})
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
				ev, err := hub.Publish(ctx, topic, map[string]string{"id": id, "topic": topic}, replayd.WithEventID(id))
				if err != nil {
					die(3, err)
				}
				say("ack %d %s %s", ev.Sequence, id, cmpOr(topic, "-"))
			}
		}()
	}
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

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
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

// startNode re-executes the test binary as a node; its acknowledgements go
// to tr as they arrive.
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
			case len(f) == 4 && f[0] == "ack":
				seq, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					tr.fail("%s: %q", name, sc.Text())
					continue
				}
				topic := f[3]
				if topic == "-" {
					topic = ""
				}
				tr.add(seq, f[2], topic, "ack")
			case len(f) == 2 && f[0] == "pruned":
				n, _ := strconv.ParseInt(f[1], 10, 64)
				p.mu.Lock()
				if p.pruned == 0 {
					close(p.prunedOnce)
				}
				p.pruned += n
				p.mu.Unlock()
			case len(f) == 1 && f[0] == "stopped":
				close(p.stopped)
			default:
				tr.fail("%s: unexpected line %q", name, sc.Text())
			}
		}
	}, env...)
	return p
}
