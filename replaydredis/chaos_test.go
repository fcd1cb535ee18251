package replaydredis

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

var (
	chaosSeedFlag     = flag.Uint64("chaos.seed", 0, "seed of TestChaos (0: from the clock)")
	chaosDurationFlag = flag.Duration("chaos.duration", 0, "how long TestChaos runs its chaos phase (0: 10s, 2s with -short)")
)

// TestChaos checks the guarantee under disorder on Redis (see the package
// chaostest): every hub is another node's, with its own Store and clients,
// on the log of a fresh prefix. Every random choice comes from
// -chaos.seed, so a failing seed replays the same decisions:
//
//	go test -run '^TestChaos$' -chaos.seed=42 -chaos.duration=5m .
func TestChaos(t *testing.T) {
	chaostest.Run(t, redisChaosLog, chaostest.Config{Seed: *chaosSeedFlag, Duration: chaosDuration()})
}

// TestChaosTopicRetention is TestChaos with retention per topic (issue
// 30): t0 pruned every second by a policy of its own, t1 never, the rest
// by the pruners' random default (chaostest.Config.TopicRetention).
func TestChaosTopicRetention(t *testing.T) {
	chaostest.Run(t, redisChaosLog, chaostest.Config{Seed: *chaosSeedFlag, Duration: chaosDuration(), TopicRetention: true})
}

// chaosDuration is -chaos.duration, 10 s when unset (the package's suite
// runs in CI), 2 s with -short.
func chaosDuration() time.Duration {
	duration := *chaosDurationFlag
	if duration <= 0 && !testing.Short() {
		duration = 10 * time.Second
	}
	return duration
}

// redisChaosLog opens every hub of a chaos run as another node would: its
// own Store and clients, on the log of a fresh prefix of one redis-server.
func redisChaosLog(t *testing.T) chaostest.Open {
	srv := redisserver.Start(t)
	prefix := testPrefix(t)
	return func(opts replayd.Options) (*replayd.EventHub, func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := Open(ctx, srv.URL(), WithPrefix(prefix))
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
