package replaydpg

import (
	"testing"
	"time"

	"github.com/replayd/replayd/hubtest"
)

// TestJobsCost runs hubtest.JobsCost on PostgreSQL (issue 29, item 3):
// 200 jobs × 50 tokens/s for 20 s on one node; the figures are in
// BENCHMARKS.md. Opt-in, on a cluster with fsync on:
//
//	source .ci/pg.sh   # with REPLAYD_PG_FSYNC=1
//	REPLAYD_JOBS_COST=1 go test -run '^TestJobsCost$' -v -timeout 10m .
func TestJobsCost(t *testing.T) {
	s := &countingStore{Store: openPrefix(t, testPrefix(t))}
	hubtest.JobsCost(t, s, s.commits, 200, 20*time.Second)
}
