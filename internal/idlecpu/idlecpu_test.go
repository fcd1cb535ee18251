package idlecpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// eventually reports whether Busy returned want within a few seconds.
func eventually(want bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if Busy() == want {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// More spinning goroutines than Ps: some wait for one, and Busy says so;
// once they end, it says the process has room again.
func TestBusy(t *testing.T) {
	if !eventually(false) {
		t.Fatal("an idle test process is busy")
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) + 2 {
		wg.Go(func() {
			for !stop.Load() {
			}
		})
	}
	busy := eventually(true)
	stop.Store(true)
	wg.Wait()
	if !busy {
		t.Error("not busy with more spinning goroutines than Ps")
	}
	if !eventually(false) {
		t.Error("still busy after they ended")
	}
}
