package replaydredis

import (
	"context"
	"testing"

	"github.com/replayd/replayd/hubtest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// The Durable Streams sweep on two nodes of one Redis (hubtest.CheckSweep):
// DueStreams and PruneTopic under the hub's Sweeper.
func TestStreamsSweepTwoNodes(t *testing.T) {
	srv := redisserver.Start(t)
	prefix := testPrefix(t)
	a, b := openStore(t, srv.URL(), prefix), openStore(t, srv.URL(), prefix)
	hubtest.CheckSweep(t, hubtest.Sweep{
		Stores: [2]hubtest.SweepStore{a, b},
		Rows: func(ctx context.Context, topic string) (events, records int, err error) {
			e, err := a.c.ZCard(ctx, a.p+tkeyGo(topic)).Result()
			if err != nil {
				return 0, 0, err
			}
			r, err := a.c.Exists(ctx, a.p+"s:"+topic).Result()
			return int(e), int(r), err
		},
	})
}
