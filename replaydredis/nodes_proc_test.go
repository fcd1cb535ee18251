package replaydredis

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/nodetest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// Three nodes as three OS processes (this test binary re-executed), each a
// hub on its own store of one Redis log (appendfsync always) with
// StartTail, its SSE handler and its poll handler (/poll) on 127.0.0.1,
// publishing from two goroutines; node 0 prunes to the newest 600 every
// 200 ms. During the run node 1 is killed with SIGKILL and restarted;
// redis-server is killed with SIGKILL and restarted on its files and port;
// then Redis is killed again, node 2 is killed while Redis is down, and
// both come back. While Redis is down the nodes' publishes fail (each is
// an attempt, not an acknowledgement, in the ledger) and their handlers
// may answer 503; every node publishes again once Redis is back. Clients
// in this process hop between the nodes over SSE with their
// Last-Event-ID, over polls passing their cursor back, and switching
// between the two on one cursor (internal/nodetest's sixteen, as
// replaydpg's TestNodesInProcesses runs them). The nodes report every
// publish attempted and every event Publish returned; a reader records
// the log as it grows. The chaos oracle (chaostest.Check) then holds every
// frame and every poll answer to that ledger and the log: 0 violations.

const (
	procURLEnv    = "REPLAYD_REDIS_NODE_URL"    // run as a node on this Redis
	procPrefixEnv = "REPLAYD_REDIS_NODE_PREFIX" // its key prefix
	procNameEnv   = "REPLAYD_REDIS_NODE_NAME"   // prefix of its event ids
	procPruneEnv  = "REPLAYD_REDIS_NODE_PRUNE"  // "1": prune in a loop
	procKeep      = 600                         // the pruning node keeps the newest procKeep events
	procLimit     = 1000                        // the nodes' ReplayLimit
)

var nodesSeedFlag = flag.Uint64("nodes.seed", 0, "seed of TestNodesRedisProcesses (0: from the clock)")

func TestNodesRedisProcesses(t *testing.T) {
	if u := os.Getenv(procURLEnv); u != "" {
		runProcNode(u, os.Getenv(procPrefixEnv), os.Getenv(procNameEnv), os.Getenv(procPruneEnv) == "1")
		os.Exit(0)
	}
	srv := redisserver.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	prefix := testPrefix(t)
	seed := *nodesSeedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -nodes.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1<<40))
	tr := nodetest.NewTruth(seed)
	began := tr.Timeline.Start
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The parent's store records the log as it grows (retrying while
	// Redis is down), so rows pruned before the end are still known.
	rec := openStore(t, srv.URL(), prefix)
	recorder := nodetest.Record(ctx, tr, rec, nil, true)
	defer recorder.Close()

	cl := &nodetest.Cluster{Limit: procLimit, Outages: true}
	var all []*nodetest.Proc // every node process started
	failed := func() int {
		n := 0
		for _, p := range all {
			n += p.Fails()
		}
		return n
	}
	launch := func(i, gen int) *nodetest.Proc {
		name := fmt.Sprintf("n%dg%d", i, gen)
		env := []string{procURLEnv + "=" + srv.URL(), procPrefixEnv + "=" + prefix, procNameEnv + "=" + name}
		if i == 0 {
			env = append(env, procPruneEnv+"=1")
		}
		p := nodetest.StartNode(t, tr, "TestNodesRedisProcesses", name, nil, env...)
		all = append(all, p)
		return p
	}
	up := func(i, gen int, p *nodetest.Proc) {
		select {
		case addr := <-p.Addr:
			cl.SetAddr(i, addr, gen)
			tr.Timeline.Add("node " + p.Name + " up")
		case <-time.After(20 * time.Second):
			t.Fatalf("node %s did not start within 20s: %s", p.Name, p.Stderr())
		}
	}
	start := func(i, gen int) *nodetest.Proc {
		p := launch(i, gen)
		up(i, gen, p)
		return p
	}
	kill := func(i int, p *nodetest.Proc) {
		p.Kill()
		if state := p.Wait(); state.Exited() {
			t.Fatalf("node %s exited by itself (%v) instead of being killed: %s", p.Name, state, p.Stderr())
		}
		_, gen, _ := cl.Addr(i)
		cl.SetAddr(i, "", gen)
		tr.Timeline.Add("node " + p.Name + " killed")
	}
	// redisDown kills redis-server, runs during (while it is down), and
	// restarts it on its files and port after 50-300 ms.
	redisDown := func(during func()) time.Duration {
		tr.Timeline.Add("redis-server killed")
		killed := time.Now()
		srv.Kill()
		if during != nil {
			during()
		}
		nodetest.SleepCtx(ctx, time.Duration(50+rng.IntN(250))*time.Millisecond)
		srv.Restart()
		tr.Timeline.Add("redis-server restarted")
		return time.Since(killed)
	}
	// publishing waits until every node has acknowledged a publish more.
	publishing := func(nodes []*nodetest.Proc, before []int, when string) {
		for i, p := range nodes {
			if !p.WaitAcks(before[i]+1, 20*time.Second) {
				t.Fatalf("node %s acknowledged nothing within 20s %s: %s", p.Name, when, p.Stderr())
			}
		}
	}
	acks := func(nodes []*nodetest.Proc) []int {
		n := make([]int, len(nodes))
		for i, p := range nodes {
			n[i] = p.Acks()
		}
		return n
	}

	nodes := []*nodetest.Proc{start(0, 1), start(1, 1), start(2, 1)}
	clients, stopClients := nodetest.StartClients(ctx, tr, cl, nodetest.Specs, nodes[0].PrunedOnce)
	defer stopClients()

	// Run until node 0 has pruned (at least 1.5 s); kill node 1 and
	// restart it.
	nodetest.SleepCtx(ctx, 1500*time.Millisecond)
	select {
	case <-nodes[0].PrunedOnce:
	case <-time.After(20 * time.Second):
		t.Fatalf("node 0 pruned nothing within 20s: %s", nodes[0].Stderr())
	}
	kill(1, nodes[1])
	nodes[1] = start(1, 2)
	nodetest.SleepCtx(ctx, time.Duration(500+rng.IntN(500))*time.Millisecond)

	// Redis killed and restarted under the three nodes.
	before, failed0 := acks(nodes), failed()
	down := redisDown(nil)
	publishing(nodes, before, "of Redis's first restart")
	t.Logf("redis-server killed at %v, back after %v; %d publishes failed", time.Since(began).Round(time.Millisecond), down.Round(time.Millisecond), failed()-failed0)
	nodetest.SleepCtx(ctx, time.Duration(500+rng.IntN(500))*time.Millisecond)

	// Redis killed again, node 2 killed while it is down and started
	// again once Redis is back; node 2's first generation never sees
	// Redis come back.
	before, failed0 = acks(nodes), failed()
	down = redisDown(func() { kill(2, nodes[2]) })
	nodes[2] = start(2, 2)
	before[2] = 0
	publishing(nodes, before, "of Redis's second restart")
	t.Logf("redis-server and node 2 killed, back after %v; %d publishes failed", down.Round(time.Millisecond), failed()-failed0)
	nodetest.SleepCtx(ctx, time.Duration(700+rng.IntN(500))*time.Millisecond)

	// Quiesce: every node stops publishing and says so; the recorder
	// reads the rest.
	for _, p := range nodes {
		if !p.Stop(20 * time.Second) {
			t.Fatalf("node %s did not stop publishing within 20s: %s", p.Name, p.Stderr())
		}
	}
	if err := recorder.Stop(); err != nil {
		t.Fatal(err)
	}
	pruned := nodes[0].Pruned()
	for _, p := range all {
		if f := p.FirstFails(); len(f) > 0 {
			t.Logf("node %s: %d publishes failed, the first: %q", p.Name, p.Fails(), f)
		}
	}

	// Every client catches up with the newest event of its scope.
	nodetest.CatchUp(t, ctx, tr, clients, 20*time.Second)
	stopClients()

	if errs := tr.Errors(); len(errs) > 0 {
		t.Fatalf("%d failures, the first: %v", len(errs), errs[:min(len(errs), 10)])
	}
	h, err := replayd.NewWithStore(rec, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := tr.Check(t, h, clients)
	h.Close()
	var st nodetest.Stats
	for _, c := range clients {
		cs := c.Stats()
		st.Killed += cs.Killed
		st.OnRestarted += cs.OnRestarted
		st.Probes += cs.Probes
		st.Switches += cs.Switches
	}
	if pruned == 0 {
		t.Errorf("node 0 pruned nothing: the run did not exercise retention")
	}
	if failed() == 0 {
		t.Errorf("no publish failed while Redis was down: the outages exercised nothing")
	}
	if st.Killed == 0 {
		t.Errorf("no client lost its stream to a kill")
	}
	if st.OnRestarted == 0 {
		t.Errorf("no client connected to a restarted node")
	}
	if rep.ExactResumes == 0 {
		t.Errorf("no SSE client resumed on another node without a gap (%d resumes)", rep.Resumes)
	}
	if rep.Gaps["pruned"]+rep.Gaps["replay_limit"] == 0 {
		t.Errorf("no gap frame: the clients joining from cursor 0 after pruning got none")
	}
	if rep.PollExactResumes == 0 {
		t.Errorf("no poll client resumed on another node without a gap (%d resumes)", rep.PollResumes)
	}
	if st.Probes == 0 || st.Switches == 0 {
		t.Errorf("%d unknown_cursor probes, %d transport switches: want some of each", st.Probes, st.Switches)
	}
	t.Logf("%d events, head %d, %d pruned by node 0, %d publishes failed while Redis was down; %d SSE resumes on another node (%d exact, with events and no gap), %d poll sessions resumed on another node (%d exact); %d visits after a kill ended a stream, %d onto a restarted node; %d unknown_cursor probes, %d switches between SSE and polls; %v",
		rep.Published, tr.Head(), pruned, failed(), rep.Resumes, rep.ExactResumes, rep.PollResumes, rep.PollExactResumes,
		st.Killed, st.OnRestarted, st.Probes, st.Switches, time.Since(began).Round(time.Millisecond))
}

// runProcNode is the child: a hub on its own store of the log with
// StartTail, its SSE and poll handlers on 127.0.0.1, and
// nodetest.Node's publishers (with prune, its retention loop), going on
// through Redis's outages.
func runProcNode(url, prefix, name string, prune bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	s, err := Open(ctx, url, WithPrefix(prefix))
	cancel()
	if err != nil {
		nodetest.Die(2, err)
	}
	hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: procLimit, HeartbeatInterval: -1}})
	if err != nil {
		nodetest.Die(2, err)
	}
	if _, err := hub.StartTail(200*time.Millisecond, replayd.TailOptions{}); err != nil {
		nodetest.Die(2, err)
	}
	say, err := nodetest.Serve(hub)
	if err != nil {
		nodetest.Die(2, err)
	}
	node := nodetest.Node{Hub: hub, Say: say, Name: name, Outages: true}
	if prune {
		node.Keep = procKeep
	}
	node.Run()
}
