// Package idlecpu tells background work whether this process has a CPU to
// spare, so that it can run on the CPU time nothing else wants:
// sqlitestore's per-topic prune.
//
// Go has no goroutine priorities, and the kernel's cannot help: a Go
// process runs on GOMAXPROCS Ps, and a background goroutine holding one
// holds it until it blocks or has run for 10 ms, while the goroutines
// queued behind it wait, whatever the kernel's priorities say. What the
// runtime does publish (runtime/metrics, Go 1.26) is how many goroutines
// are running and how many are runnable, waiting for a P. Background work
// that runs only while a P is idle, in short units, and looks again
// between them, leaves the CPU to the others as a low priority would.
package idlecpu

import "runtime/metrics"

// Busy reports whether this process has no P to spare: goroutines wait
// for one, or every P but the caller's runs one. It takes the scheduler's
// lock for a moment (well under a microsecond): call it between units of
// work, not inside one.
func Busy() bool {
	s := []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Kind() == metrics.KindUint64 && s[0].Value.Uint64() > 0
}
