package replayd_test

import (
	"testing"

	"github.com/replayd/replayd/hubtest"
)

// The job-stream subtests on the SQLite store (hubtest.RunJobs): each
// subtest gets a new database file, each hub on it a pool of its own.
// The SQLite-specific job tests (the relay client, coalescing, the log's
// other readers) are jobs_*_test.go's.
func TestJobsSuite(t *testing.T) {
	hubtest.RunJobs(t, sqliteLog)
}
