package replaydpg

import (
	"context"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

// The hub's behaviour suite on PostgreSQL: each subtest gets its own
// tables (a fresh prefix), and each hub on them its own store and pool, as
// another node would.
func TestHubSuite(t *testing.T) {
	hubtest.Run(t, func(t *testing.T) func(opts replayd.Options) *replayd.EventHub {
		dsn, prefix := testDSN(t), testPrefix(t)
		return func(opts replayd.Options) *replayd.EventHub {
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
	})
}
