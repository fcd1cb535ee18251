package replaydpg

import (
	"context"
	"testing"

	"github.com/replayd/replayd/hubtest"
)

// The Durable Streams sweep on two nodes of one PostgreSQL
// (hubtest.CheckSweep).
func TestStreamsSweepTwoNodes(t *testing.T) {
	a, prefix := openTestStore(t)
	b := openPrefix(t, prefix)
	pool := testPool(t)
	hubtest.CheckSweep(t, hubtest.Sweep{
		Stores: [2]hubtest.SweepStore{a, b},
		Rows: func(ctx context.Context, topic string) (events, records int, err error) {
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`events WHERE topic = $1`, topic).Scan(&events); err != nil {
				return 0, 0, err
			}
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`streams WHERE topic = $1`, topic).Scan(&records)
			return events, records, err
		},
	})
}
