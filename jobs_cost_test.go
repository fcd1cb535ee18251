package replayd_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/replayd/replayd/hubtest"
	"github.com/replayd/replayd/internal/countstore"
)

// TestJobsCost runs hubtest.JobsCost on SQLite (issue 29, item 3): 200
// jobs × 50 tokens/s for 20 s; the figures are in BENCHMARKS.md. Opt-in:
//
//	REPLAYD_JOBS_COST=1 go test -run '^TestJobsCost$' -v -timeout 10m .
func TestJobsCost(t *testing.T) {
	s := countstore.OpenCounting(t, filepath.Join(t.TempDir(), "log.db"))
	hubtest.JobsCost(t, s, s.Commits.Load, 200, 20*time.Second)
}
