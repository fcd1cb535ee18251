package replaydredis

import (
	"context"
	"testing"
	"time"

	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// Ready (ProbeWrite) answers nil on a primary that takes writes, and fails
// where a publish would: a primary refusing writes (min-replicas-to-write
// not met), and Redis down. A store cannot open on a read-only replica.
func TestReady(t *testing.T) {
	srv := redisserver.Start(t)
	s := openStore(t, srv.URL(), testPrefix(t))
	h := hubOn(t, s)
	if err := h.Ready(ctxT(t)); err != nil {
		t.Fatalf("Ready on a primary: %v", err)
	}
	raw := rawClient(t, srv)
	if err := raw.ConfigSet(ctxT(t), "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := h.Ready(ctxT(t)); err == nil {
		t.Fatal("Ready on a primary refusing writes (min-replicas-to-write 1, no replica): nil")
	}
	if _, err := h.Publish(ctxT(t), "", 1); err == nil {
		t.Fatal("Publish on a primary refusing writes: nil")
	}
	if err := raw.ConfigSet(ctxT(t), "min-replicas-to-write", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := h.Ready(ctxT(t)); err != nil {
		t.Fatalf("Ready once writes are taken again: %v", err)
	}

	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", srv.Port())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if rs, err := Open(ctx, replica.URL(), WithPrefix(testPrefix(t))); err == nil {
		rs.Close()
		t.Fatal("Open on a read-only replica: nil")
	}

	srv.Kill()
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := h.Ready(ctx); err == nil {
		t.Fatal("Ready with Redis down: nil")
	}
}
