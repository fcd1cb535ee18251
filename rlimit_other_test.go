//go:build !unix

package replayd

import "testing"

// loadRaiseNoFile is a no-op where there is no RLIMIT_NOFILE.
func loadRaiseNoFile(*testing.T, uint64) {}
