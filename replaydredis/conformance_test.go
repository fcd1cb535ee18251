package replaydredis

import (
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
	"github.com/replayd/replayd/storetest"
)

// The Redis store keeps replayd's storage contract: one redis-server, each
// subtest a log of its own (a fresh key prefix), and each store on it its
// own clients, as another node would.
func TestConformance(t *testing.T) {
	srv := redisserver.Start(t)
	storetest.Run(t, func(t *testing.T) func() replayd.Store {
		prefix := testPrefix(t)
		return func() replayd.Store { return openStore(t, srv.URL(), prefix) }
	})
}
