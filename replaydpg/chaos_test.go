package replaydpg

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
)

var (
	chaosSeedFlag     = flag.Uint64("chaos.seed", 0, "seed of TestChaos (0: from the clock)")
	chaosDurationFlag = flag.Duration("chaos.duration", 0, "how long TestChaos runs its chaos phase (0: 15s, 2s with -short)")
)

// TestChaos checks the guarantee under disorder on PostgreSQL (see the package
// chaostest): every hub is another node's, with its own Store and pool, on
// the tables of a fresh prefix. Every random choice comes from -chaos.seed,
// so a failing seed replays the same decisions:
//
//	go test -run '^TestChaos$' -chaos.seed=42 -chaos.duration=5m .
func TestChaos(t *testing.T) {
	chaostest.Run(t, pgChaosLog, chaostest.Config{Seed: *chaosSeedFlag, Duration: chaosDuration()})
}

// TestChaosTopicRetention is TestChaos with retention per topic (issue
// 30): t0 pruned every second by a policy of its own, t1 never, the rest
// by the pruners' random default (chaostest.Config.TopicRetention).
func TestChaosTopicRetention(t *testing.T) {
	chaostest.Run(t, pgChaosLog, chaostest.Config{Seed: *chaosSeedFlag, Duration: chaosDuration(), TopicRetention: true})
}

// chaosDuration is -chaos.duration, 15 s when unset (the package's suite
// runs in CI: shorter than SQLite's 20 s).
func chaosDuration() time.Duration {
	duration := *chaosDurationFlag
	if duration <= 0 && !testing.Short() {
		duration = 15 * time.Second
	}
	return duration
}

// pgChaosLog opens every hub of a chaos run as another node would: its
// own Store and pool, on the tables of a fresh prefix.
func pgChaosLog(t *testing.T) chaostest.Open {
	dsn, prefix := testDSN(t), testPrefix(t)
	return func(opts replayd.Options) (*replayd.EventHub, func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := Open(ctx, dsn, WithTablePrefix(prefix))
		if err != nil {
			return nil, nil, err
		}
		h, err := replayd.NewWithStore(s, opts)
		if err != nil {
			s.Close()
			return nil, nil, err
		}
		return h, func() {
			if err := h.Close(); err != nil {
				t.Errorf("close a hub: %v", err)
			}
			s.Close()
		}, nil
	}
}
