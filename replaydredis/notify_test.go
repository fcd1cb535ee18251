package replaydredis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// A tailing hub learns of another node's publish from the listener's
// blocking XREAD, not from its fallback poll: with the poll a minute
// apart, the event still arrives within seconds.
func TestTailWokenByXREAD(t *testing.T) {
	a, got := tailing(t, redisserver.Start(t))
	for i := range 3 {
		// Only the first could be caught by the tail's first read: the
		// others wake it through WaitForAppend.
		ev, err := a.Publish(ctxT(t), "", i)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case s := <-got:
			if s != ev.Sequence {
				t.Fatalf("hub B delivered %d, want %d", s, ev.Sequence)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("hub B did not deliver %d within 10 s with its fallback poll a minute apart", ev.Sequence)
		}
	}
}

// WaitForAppend returns at once for a head above after, when an append
// goes above it, with ctx's error when ctx ends, and ErrClosed once the
// store is closed, waking a waiter.
func TestWaitForAppend(t *testing.T) {
	srv := redisserver.Start(t)
	prefix := testPrefix(t)
	s, other := openStore(t, srv.URL(), prefix), openStore(t, srv.URL(), prefix)
	h, err := s.Head(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForAppend(ctxT(t), h-1); err != nil {
		t.Fatalf("WaitForAppend below the head: %v", err)
	}
	woke := make(chan error, 1)
	go func() { woke <- s.WaitForAppend(ctxT(t), h) }()
	ev := mustAppend(t, other, "w1")[0]
	select {
	case err := <-woke:
		if err != nil {
			t.Fatalf("WaitForAppend woken by %d: %v", ev.Sequence, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitForAppend not woken by another store's append within 10 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.WaitForAppend(ctx, ev.Sequence); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForAppend with nothing to wait for: %v, want its ctx's error", err)
	}
	go func() { woke <- s.WaitForAppend(context.Background(), ev.Sequence) }()
	s.Close()
	select {
	case err := <-woke:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("WaitForAppend across Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake WaitForAppend within 10 s")
	}
}

// The listener outlives a Redis restart: hub B, tailing with its fallback
// poll a minute apart, goes on delivering hub A's publishes once
// redis-server was killed and started again (on its AOF, nothing lost).
func TestTailAcrossRedisRestart(t *testing.T) {
	srv := redisserver.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	a, got := tailing(t, srv)
	expect := func(what string) {
		t.Helper()
		ev, err := a.Publish(ctxT(t), "", what)
		if err != nil {
			t.Fatalf("publish %s: %v", what, err)
		}
		select {
		case s := <-got:
			if s != ev.Sequence {
				t.Fatalf("%s: hub B delivered %d, want %d", what, s, ev.Sequence)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: hub B did not deliver %d within 20 s", what, ev.Sequence)
		}
	}
	expect("before")
	srv.Kill()
	srv.Restart()
	for _, what := range []string{"after 1", "after 2"} {
		expect(what)
	}
}

// tailing opens hubs A and B on a log of srv, B tailing with its fallback
// poll a minute apart; it returns A and what B's subscriber gets.
func tailing(t *testing.T, srv *redisserver.Server) (*replayd.EventHub, <-chan int64) {
	prefix := testPrefix(t)
	a, b := hubOn(t, openStore(t, srv.URL(), prefix)), hubOn(t, openStore(t, srv.URL(), prefix))
	stop, err := b.StartTail(time.Minute, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	got := make(chan int64, 16)
	t.Cleanup(b.Subscribe(func(ev replayd.Event) { got <- ev.Sequence }))
	return a, got
}
