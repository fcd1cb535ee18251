//go:build linux || darwin

package replayd

import (
	"syscall"
	"testing"
	"time"
)

// loadRaiseNoFile makes sure this process may open n files.
func loadRaiseNoFile(t testing.TB, n uint64) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if lim.Cur >= n {
		return
	}
	old := lim
	lim.Cur = n
	lim.Max = max(lim.Max, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("RLIMIT_NOFILE is %d (max %d) and cannot be raised to %d: %v", old.Cur, old.Max, n, err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
