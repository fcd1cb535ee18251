package replaydpg

import (
	"os"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

// A child's log: the cluster and the table prefix.
const (
	jobsDSNEnv    = "REPLAYD_PG_JOBS_DSN"
	jobsPrefixEnv = "REPLAYD_PG_JOBS_PREFIX"
)

// Job streams across OS processes on PostgreSQL
// (hubtest.RunJobsProcesses): two node processes, each its own hub and
// pool on one database, race 100 starts of the same ids; a node process
// running a job is SIGKILLed mid-answer and the job is read from another
// node (the test's process).
func TestJobsProcesses(t *testing.T) {
	if hubtest.JobsChild(t, func(opts replayd.Options) *replayd.EventHub {
		return openHubOn(t, os.Getenv(jobsDSNEnv), os.Getenv(jobsPrefixEnv), opts)
	}) {
		return
	}
	hubtest.RunJobsProcesses(t, "TestJobsProcesses", func(t *testing.T) hubtest.JobsLog {
		dsn, prefix := testDSN(t), testPrefix(t)
		return hubtest.JobsLog{Env: []string{jobsDSNEnv + "=" + dsn, jobsPrefixEnv + "=" + prefix},
			Open: func(opts replayd.Options) *replayd.EventHub { return openHubOn(t, dsn, prefix, opts) }}
	})
}
