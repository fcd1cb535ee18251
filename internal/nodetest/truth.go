// Package nodetest is the kit of the multi-node chaos tests that run their
// nodes as OS processes (the test binary re-executed, see
// internal/childproc): replaydpg's TestNodesInProcesses and
// TestCrashDurability, replaydredis's TestNodesRedisProcesses. It holds
// what every such test needs once:
//
//   - the child side: Serve (a node's SSE and poll handlers on a local
//     listener, and the line it reports on) and Node.Run (publishers, a
//     pruner, and the "stop" handshake, reporting every attempt and every
//     acknowledgement);
//   - the parent side: StartNode (reads a node's report into the oracle's
//     ledger), Record (reads the log as it grows), Cluster (the nodes'
//     current addresses), Client (hops between the nodes over SSE, polls
//     or both, recording every connection and poll), and Truth.Check,
//     which hands it all to the chaos oracle (chaostest.Check).
//
// The store under the nodes is the test's: the kit only sees hubs and a
// storage.Store to read the log with.
package nodetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
)

// Truth is what a multi-node test knows: the oracle's ledger (what the
// nodes' publishes returned or attempted, rows read from the log), the
// timeline of kills and restarts, and the test's own failures (a client
// that cannot go on, a node's unexpected output). The checks are the
// oracle's (Check).
type Truth struct {
	Ledger   *chaostest.Ledger
	Timeline *chaostest.Timeline
	Seed     uint64
	ids      atomic.Int64 // record ids, for traces

	mu   sync.Mutex
	errs []string
}

// NewTruth returns an empty Truth for a run of seed.
func NewTruth(seed uint64) *Truth {
	return &Truth{Ledger: chaostest.NewLedger(), Timeline: chaostest.NewTimeline(), Seed: seed}
}

// Add records a row of the log the test has verified itself,
// acknowledged at its sequence or not: the oracle takes it as published.
func (tr *Truth) Add(ev replayd.Event, acked bool) {
	if acked {
		tr.Ledger.Published(ev)
		return
	}
	tr.Ledger.Attempted(ev)
	tr.Ledger.Logged(ev)
}

// Fail records a failure of the test (not of the system under test: the
// oracle finds those); the test reports Errors when it is time.
func (tr *Truth) Fail(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.errs = append(tr.errs, fmt.Sprintf(format, args...))
}

// Errors returns the failures recorded so far.
func (tr *Truth) Errors() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.errs)
}

// Last returns the newest sequence known committed that scope sees.
func (tr *Truth) Last(scope []string) int64 { return tr.Ledger.Last(scope) }

// Head returns the newest sequence known committed.
func (tr *Truth) Head() int64 { return tr.Last(nil) }

// Check hands the ledger, the log as h reads it now and every client's
// records to the chaos oracle; it reports the violations (with traces)
// and what was checked, and returns the report.
func (tr *Truth) Check(t *testing.T, h *replayd.EventHub, clients []*Client) *chaostest.Report {
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
	in := chaostest.Input{Ledger: tr.Ledger, Log: rows, Mark: mark, Head: head, Seed: tr.Seed, Timeline: tr.Timeline}
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
		t.Errorf("the chaos oracle found %d violations; seed %d", n, tr.Seed)
	}
	return rep
}

// SleepCtx waits d or until ctx ends.
func SleepCtx(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}
