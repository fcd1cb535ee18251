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
	duration := *chaosDurationFlag
	if duration <= 0 && !testing.Short() {
		duration = 10 * time.Second // the package's suite runs in CI
	}
	srv := redisserver.Start(t)
	chaostest.Run(t, func(t *testing.T) chaostest.Open {
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
	}, chaostest.Config{Seed: *chaosSeedFlag, Duration: duration})
}
