package replaydpg

import (
	"context"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storetest"
)

// The PostgreSQL store keeps replayd's storage contract: each subtest gets
// its own tables (a fresh prefix), and each store on them its own pool, as
// another node would.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() replayd.Store {
		dsn, prefix := testDSN(t), testPrefix(t)
		return func() replayd.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := Open(ctx, dsn, WithTablePrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
	})
}
