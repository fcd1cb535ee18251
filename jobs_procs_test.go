package replayd_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

const jobsLogEnv = "REPLAYD_JOBS_TEST_LOG" // a child's database file

// Job streams across OS processes on one SQLite file
// (hubtest.RunJobsProcesses): two processes race 100 starts of the same
// ids; a process running a job is SIGKILLed mid-answer and the job is
// read from a hub opened afterwards on the file (the node restarted).
func TestJobsProcesses(t *testing.T) {
	if hubtest.JobsChild(t, func(opts replayd.Options) *replayd.EventHub { return openHub(t, os.Getenv(jobsLogEnv), opts) }) {
		return
	}
	hubtest.RunJobsProcesses(t, "TestJobsProcesses", func(t *testing.T) hubtest.JobsLog {
		path := filepath.Join(t.TempDir(), "log.db")
		return hubtest.JobsLog{Env: []string{jobsLogEnv + "=" + path},
			Open: func(opts replayd.Options) *replayd.EventHub { return openHub(t, path, opts) }}
	})
}
