package replaydpg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// TestReadyHeadLocked holds the head row's lock from another connection,
// as a stuck transaction would: no publish can get through, so Ready must
// fail within its ctx, leaving no session of its own queued on the lock;
// once the lock is released Ready is nil again.
func TestReadyHeadLocked(t *testing.T) {
	s, prefix := openTestStore(t)
	hub, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	ready := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err := hub.Ready(ctx)
		return time.Since(start), err
	}
	if d, err := ready(); err != nil {
		t.Fatalf("Ready before the lock: %v (%v)", err, d)
	}
	raw := testPool(t)
	tx, pid := holdHead(t, raw, prefix)

	// What a publish meets meanwhile.
	pctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, perr := hub.Publish(pctx, "t", 1)
	cancel()
	if !errors.Is(perr, context.DeadlineExceeded) {
		t.Fatalf("Publish while the head row is locked = %v, want its deadline", perr)
	}
	for i := range 3 {
		d, err := ready()
		t.Logf("Ready while the head row is locked: %v after %v", err, d.Round(time.Millisecond))
		if err == nil {
			t.Fatalf("Ready %d while the head row is locked = nil after %v, want an error", i, d)
		}
		if d > 1500*time.Millisecond {
			t.Errorf("Ready took %v with a 1 s ctx", d)
		}
	}
	// The probe gave up on the server, not only in the client: nothing of
	// it stays queued behind the lock. (The publish above does: the hub's
	// writer waits on.)
	waitBlockedBy(t, raw, pid, 1)

	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d, err := ready(); err != nil {
		t.Fatalf("Ready after the lock was released: %v (%v)", err, d)
	}
}
