package prunepace

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A prune of a quiet log never pauses; once the head moves it pauses at
// least minPause after each batch, for Busy after the last move; an ended
// context ends a pause with its error.
func TestPause(t *testing.T) {
	var head atomic.Int64
	p := New(head.Load, 10)
	pause := func() time.Duration {
		t.Helper()
		p.Start()
		t0 := time.Now()
		if err := p.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	}
	if d := pause(); d >= minPause {
		t.Errorf("quiet log: paused %v", d)
	}
	head.Add(1)
	if d := pause(); d < minPause {
		t.Errorf("appended to: paused %v, want at least %v", d, minPause)
	}
	if d := pause(); d < minPause {
		t.Errorf("appended to within Busy: paused %v, want at least %v", d, minPause)
	}
	p.busy = time.Now().Add(-2 * Busy) // the last move, long ago
	if d := pause(); d >= minPause {
		t.Errorf("quiet again: paused %v", d)
	}
	head.Add(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.Start()
	if err := p.Pause(ctx); err != context.Canceled {
		t.Errorf("ended context: %v", err)
	}
}
