package replaydredis

import (
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// The hub's behaviour suite on Redis: one redis-server, each subtest a log
// of its own (a fresh key prefix), and each hub on it its own store, as
// another node would.
func TestHubSuite(t *testing.T) {
	srv := redisserver.Start(t)
	hubtest.Run(t, func(t *testing.T) func(opts replayd.Options) *replayd.EventHub {
		prefix := testPrefix(t)
		return func(opts replayd.Options) *replayd.EventHub {
			s := openStore(t, srv.URL(), prefix)
			h, err := replayd.NewWithStore(s, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			return h
		}
	})
}
