//go:build !linux && !darwin

package replayd

import (
	"testing"
	"time"
)

// loadRaiseNoFile is a no-op where there is no RLIMIT_NOFILE, or where its
// fields are not uint64 (the BSDs): the load test then runs at the limit
// the process has.
func loadRaiseNoFile(testing.TB, uint64) {}

// processCPU is not measured here.
func processCPU() (time.Duration, bool) { return 0, false }
