package replayd_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

// TestPruneTopicCost measures what pruning one topic of a million rows
// costs everyone else, on SQLite (hubtest.PruneTopicCost; replaydpg has
// the same on PostgreSQL). Opt-in, not run by CI:
//
//	REPLAYD_PRUNE_COST=1 go test -run '^TestPruneTopicCost$' -v -timeout 30m .
//
// REPLAYD_PRUNE_COST_ROWS sets the bulk topic's rows (default 1,000,000),
// REPLAYD_PRUNE_COST_PAIRS the pairs (default 2).
func TestPruneTopicCost(t *testing.T) {
	if os.Getenv("REPLAYD_PRUNE_COST") == "" {
		t.Skip("set REPLAYD_PRUNE_COST=1 to measure")
	}
	path := filepath.Join(t.TempDir(), "log.db")
	hubtest.PruneTopicCost(t, func(opts replayd.Options) *replayd.EventHub { return openHub(t, path, opts) },
		envInt("REPLAYD_PRUNE_COST_ROWS", 1_000_000), envInt("REPLAYD_PRUNE_COST_PAIRS", 2))
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
