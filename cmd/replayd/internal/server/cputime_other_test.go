//go:build !unix

package server

import "time"

// cpuTime is not measured here: the benchmark's CPU figures read 0.
func cpuTime() time.Duration { return 0 }
