package replaydpg

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

// The hub's behaviour suite on PostgreSQL: each subtest gets its own
// tables (a fresh prefix), and each hub on them its own store and pool, as
// another node would.
func TestHubSuite(t *testing.T) {
	hubtest.Run(t, pgLog)
}

// TestPruneTopicCost is the root's, on PostgreSQL: what pruning one topic
// of a million rows costs everyone else (hubtest.PruneTopicCost). Opt-in,
// not run by CI:
//
//	REPLAYD_PRUNE_COST=1 go test -run '^TestPruneTopicCost$' -v -timeout 30m .
//
// REPLAYD_PRUNE_COST_ROWS sets the bulk topic's rows (default 1,000,000),
// REPLAYD_PRUNE_COST_PAIRS the pairs (default 2).
func TestPruneTopicCost(t *testing.T) {
	if os.Getenv("REPLAYD_PRUNE_COST") == "" {
		t.Skip("set REPLAYD_PRUNE_COST=1 to measure")
	}
	atoi := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	hubtest.PruneTopicCost(t, pgLog(t), atoi("REPLAYD_PRUNE_COST_ROWS", 1_000_000), atoi("REPLAYD_PRUNE_COST_PAIRS", 2))
}

// pgLog returns a function that opens hubs, each on its own store and
// pool, on the tables of a fresh prefix: hubtest's newLog.
func pgLog(t *testing.T) func(opts replayd.Options) *replayd.EventHub {
	dsn, prefix := testDSN(t), testPrefix(t)
	return func(opts replayd.Options) *replayd.EventHub { return openHubOn(t, dsn, prefix, opts) }
}

// openHubOn opens a store of its own on the tables of prefix, and a hub
// on it; both are closed at the end of the test.
func openHubOn(t *testing.T, dsn, prefix string, opts replayd.Options) *replayd.EventHub {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	h, err := replayd.NewWithStore(s, opts)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		s.Close()
	})
	return h
}

// The job-stream subtests on PostgreSQL (hubtest.RunJobs): each hub on
// its own store and pool, as another node.
func TestJobsSuite(t *testing.T) {
	hubtest.RunJobs(t, pgLog)
}
