package replayd_test

import (
	"path/filepath"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
)

// TestChaos checks the guarantee under disorder on SQLite (see the package
// chaostest): every hub is another process's, on its own pool of one
// database file. Every random choice comes from -chaos.seed, so a failing
// seed replays the same decisions:
//
//	go test -run '^TestChaos$' -chaos.seed=42 -chaos.duration=5m .
func TestChaos(t *testing.T) {
	chaostest.Run(t, sqliteChaosLog, chaostest.Config{
		Seed:         *replayd.ChaosSeedFlag,
		Duration:     *replayd.ChaosDurationFlag,
		Disconnect:   replayd.Resync,
		Transactions: true,
	})
}

// TestChaosTopicRetention is TestChaos with retention per topic (issue
// 30): t0 pruned every second by a policy of its own, t1 never, the rest
// by the pruners' random default (chaostest.Config.TopicRetention).
func TestChaosTopicRetention(t *testing.T) {
	chaostest.Run(t, sqliteChaosLog, chaostest.Config{
		Seed:           *replayd.ChaosSeedFlag,
		Duration:       *replayd.ChaosDurationFlag,
		Disconnect:     replayd.Resync,
		Transactions:   true,
		TopicRetention: true,
	})
}

// sqliteChaosLog opens every hub of a chaos run on one SQLite file, each on
// a pool of its own, as another process would.
func sqliteChaosLog(t *testing.T) chaostest.Open {
	path := filepath.Join(t.TempDir(), "events.db")
	return func(opts replayd.Options) (*replayd.EventHub, func(), error) {
		db, err := replayd.OpenDB(path)
		if err != nil {
			return nil, nil, err
		}
		h, err := replayd.New(db, opts)
		if err != nil {
			db.Close()
			return nil, nil, err
		}
		return h, func() {
			if err := h.Close(); err != nil {
				t.Errorf("close a hub: %v", err)
			}
			db.Close()
		}, nil
	}
}
