package replaydpg

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/nodetest"
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

// The harness (the node's publishers, the clients, the recorder, the
// oracle's input) is internal/nodetest's, which replaydredis's
// TestNodesRedisProcesses runs too; this file adds PostgreSQL and the
// transactional publisher.

const (
	nodeDSNEnv    = "REPLAYD_PG_NODE_DSN"    // run as a node on this DSN
	nodePrefixEnv = "REPLAYD_PG_NODE_PREFIX" // its table prefix
	nodeNameEnv   = "REPLAYD_PG_NODE_NAME"   // prefix of its event ids
	nodePruneEnv  = "REPLAYD_PG_NODE_PRUNE"  // "1": prune in a loop
	nodeKeep      = 600                      // the pruning node keeps the newest nodeKeep events
	nodeLimit     = 1000                     // the nodes' ReplayLimit
)

var nodesSeedFlag = flag.Uint64("nodes.seed", 0, "seed of TestNodesInProcesses's clients (0: from the clock)")

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
	tr := nodetest.NewTruth(seed)
	txs := &txLedger{committed: map[string]bool{}, rolledBack: map[string]bool{}, inLog: map[string]int{}}
	began := tr.Timeline.Start
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The parent's store records the log as it grows, so rows pruned
	// before the end are still known.
	rec := openPrefixDSN(t, prefix, dsn)
	recorder := nodetest.Record(ctx, tr, rec, func(ev replayd.Event) { txs.logged(ev.EventID) }, false)
	defer recorder.Close()

	cl := &nodetest.Cluster{Limit: nodeLimit}
	start := func(i, gen int) *nodetest.Proc {
		name := fmt.Sprintf("n%dg%d", i, gen)
		env := []string{nodeDSNEnv + "=" + dsn, nodePrefixEnv + "=" + prefix, nodeNameEnv + "=" + name}
		if i == 0 {
			env = append(env, nodePruneEnv+"=1")
		}
		p := nodetest.StartNode(t, tr, "TestNodesInProcesses", name, func(f []string) bool {
			if len(f) == 2 && (f[0] == "txok" || f[0] == "txrb") {
				txs.report(f[1], f[0] == "txok")
				return true
			}
			return false
		}, env...)
		select {
		case addr := <-p.Addr:
			cl.SetAddr(i, addr, gen)
			tr.Timeline.Add("node " + name + " up")
		case <-time.After(20 * time.Second):
			t.Fatalf("node %d did not start within 20s: %s", i, p.Stderr())
		}
		return p
	}
	nodes := []*nodetest.Proc{start(0, 1), start(1, 1), start(2, 1)}
	prunedOnce := nodes[0].PrunedOnce

	// Clients: every scope shape, on every node, over SSE, over polls, and
	// switching transports (SSE, then polls, then SSE, ...) on one cursor;
	// some stay on node 1 until it dies, some join from cursor 0 once node
	// 0 has pruned (a pruned gap, then the retained events), the others
	// from the head.
	clients, stopClients := nodetest.StartClients(ctx, tr, cl, nodetest.Specs, prunedOnce)
	defer stopClients()

	// Run (until node 0 has pruned, at least 2 s), kill node 1, restart
	// it, run on.
	nodetest.SleepCtx(ctx, 2*time.Second)
	select {
	case <-prunedOnce:
	case <-time.After(20 * time.Second):
		t.Fatalf("node 0 pruned nothing within 20s: %s", nodes[0].Stderr())
	}
	nodes[1].Kill()
	nodes[1].Wait()
	cl.SetAddr(1, "", 1)
	tr.Timeline.Add("node n1g1 killed")
	killedAt := time.Now()
	nodes[1] = start(1, 2)
	t.Logf("node 1 killed at %v, back after %v", killedAt.Sub(began).Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
	nodetest.SleepCtx(ctx, 3*time.Second)

	// Quiesce: every node stops publishing and says so; then every event
	// is committed, and the recorder reads the rest.
	for i, p := range nodes {
		if !p.Stop(20 * time.Second) {
			t.Fatalf("node %d did not stop publishing within 20s: %s", i, p.Stderr())
		}
	}
	// The events of committed transactions still in the outbox reach the
	// log once the relays get to them.
	waitOutboxEmpty(t, ctx, testPoolDSN(t, dsn), prefix)
	if err := recorder.Stop(); err != nil {
		t.Fatal(err)
	}
	pruned := nodes[0].Pruned()
	txCommitted, txRolledBack := txs.check(tr)

	// Every client catches up with the newest event of its scope.
	nodetest.CatchUp(t, ctx, tr, clients, 20*time.Second)
	stopClients()

	// The oracle, on the log as a hub of this process reads it.
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
	if st.Killed == 0 {
		t.Errorf("no client lost its stream to the kill")
	}
	if st.OnRestarted == 0 {
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
	if st.Probes == 0 || st.Switches == 0 {
		t.Errorf("%d unknown_cursor probes, %d transport switches: want some of each", st.Probes, st.Switches)
	}
	if txCommitted == 0 || txRolledBack == 0 {
		t.Errorf("%d transactions with an event committed, %d rolled back: want some of each", txCommitted, txRolledBack)
	}
	t.Logf("%d events (of which %d published in committed transactions; %d more rolled back), head %d, %d pruned by node 0; %d SSE resumes on another node (%d exact, with events and no gap), %d poll sessions resumed on another node (%d exact); %d visits after the kill ended a stream, %d onto the restarted node; %d unknown_cursor probes, %d switches between SSE and polls; %v",
		rep.Published, txCommitted, txRolledBack, tr.Head(), pruned, rep.Resumes, rep.ExactResumes, rep.PollResumes, rep.PollExactResumes,
		st.Killed, st.OnRestarted, st.Probes, st.Switches, time.Since(began).Round(time.Millisecond))
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
func (l *txLedger) check(tr *nodetest.Truth) (committed, rolledBack int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.committed {
		if n := l.inLog[id]; n != 1 {
			tr.Fail("the event %s of a committed transaction is in the log %d times", id, n)
		}
	}
	for id := range l.rolledBack {
		if n := l.inLog[id]; n != 0 {
			tr.Fail("the event %s of a rolled back transaction is in the log", id)
		}
	}
	return len(l.committed), len(l.rolledBack)
}

// runNode is the child: a hub on the log with StartTail and its SSE and
// poll handlers on 127.0.0.1 (nodetest.Node: two publishers, with prune a
// retention loop), and a transactional publisher: every 20 ms a
// transaction of the application's (pgx's or database/sql's, by turns)
// publishes an event and commits, or, one time in four, rolls back. A
// commit is reported as an attempt before it ("try") and "txok" after; a
// rollback "txrb", and never as an attempt: its event must never appear.
func runNode(dsn, prefix, name string, prune bool) {
	ctx := context.Background()
	s, err := Open(ctx, dsn, WithTablePrefix(prefix))
	if err != nil {
		nodetest.Die(2, err)
	}
	hub, err := replayd.NewWithStore(s, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: nodeLimit, HeartbeatInterval: -1}})
	if err != nil {
		nodetest.Die(2, err)
	}
	if _, err := hub.StartTail(500*time.Millisecond, replayd.TailOptions{}); err != nil {
		nodetest.Die(2, err)
	}
	say, err := nodetest.Serve(hub)
	if err != nil {
		nodetest.Die(2, err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		nodetest.Die(2, err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		nodetest.Die(2, err)
	}
	txWorker := func(quit <-chan struct{}) {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			topic := nodetest.Topics[n%len(nodetest.Topics)]
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
				nodetest.Die(3, err)
			}
			if commit {
				say("txok %s", id)
			} else {
				say("txrb %s", id)
			}
		}
	}
	node := nodetest.Node{Hub: hub, Say: say, Name: name, Workers: []func(<-chan struct{}){txWorker}}
	if prune {
		node.Keep = nodeKeep
	}
	node.Run()
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
