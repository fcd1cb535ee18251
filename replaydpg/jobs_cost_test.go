package replaydpg

import (
	"os"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

// TestJobsCost runs hubtest.JobsCost on PostgreSQL (issue 29, item 3):
// 200 jobs × 50 tokens/s for 20 s on one node; the figures are in
// BENCHMARKS.md. Opt-in, on a cluster with fsync on:
//
//	source .ci/pg.sh   # with REPLAYD_PG_FSYNC=1
//	REPLAYD_JOBS_COST=1 go test -run '^TestJobsCost$' -v -timeout 10m .
func TestJobsCost(t *testing.T) {
	if os.Getenv("REPLAYD_JOBS_COST") == "" {
		t.Skip("set REPLAYD_JOBS_COST=1 to measure job streams' cost")
	}
	s := &countingStore{Store: openPrefix(t, testPrefix(t))}
	hubtest.JobsCost(t, func(opts replayd.Options) *replayd.EventHub {
		h, err := replayd.NewWithStore(s, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}, s.commits, 200, 20*time.Second)
}
