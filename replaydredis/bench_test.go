package replaydredis

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
	"github.com/replayd/replayd/storage"
)

// The figures of issue 31, item 4, on one redis-server (no persistence):
//
//	go test -run '^$' -bench . -benchtime 3s .
//
// BenchmarkPublish64 against BenchmarkRawXADD64: 64 goroutines, one
// ~100-byte event each call, through the hub (its group-commit writer
// batches concurrent publishes into one append script) and as plain
// XADDs of go-redis on a pool of 64. BenchmarkHandshake1M: an SSE
// handshake on a log of 1M events, to the end of its replay window (100
// events, the default ReplayLimit), resuming 100 events of the scope
// below the head and from cursor 0 (a replay_limit gap, then the newest
// 100), on the global scope and on one topic (with the broadcasts, half
// the log).

const payload100 = `{"text":"` + "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567" + `"}`

func BenchmarkRawXADD64(b *testing.B) {
	srv := redisserver.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	defer c.Close()
	var n atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := n.Add(1)
			if err := c.XAdd(context.Background(), &redis.XAddArgs{Stream: "raw", Values: []any{"i", id, "p", payload100}}).Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkPublish64(b *testing.B) {
	srv := redisserver.Start(b)
	h := hubOn(b, openStore(b, srv.URL(), testPrefix(b)))
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := h.Publish(context.Background(), "room", json.RawMessage(payload100)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// A benchmark that runs sub-benchmarks runs its body once: the log is
// built once for the four.
func BenchmarkHandshake1M(b *testing.B) {
	srv0 := redisserver.Start(b)
	prefix := testPrefix(b)
	s := openStore(b, srv0.URL(), prefix)
	topics := []string{"a", "b", "c", ""}
	batch := make([]storage.Event, 1000)
	for k := range 1000 {
		for j := range batch {
			batch[j] = storage.Event{EventID: fmt.Sprintf("e%d-%d", k, j), Type: "message", Topic: topics[j%4], Payload: []byte(payload100)}
		}
		if _, err := s.Append(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
	h := hubOn(b, s)
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	head, err := s.Head(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		cursor int64
		topic  string
	}{{"near-head", head - 100, ""}, {"cursor-0", 0, ""}, {"near-head/topic", head - 200, "?topic=a"}, {"cursor-0/topic", 0, "?topic=a"}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				cl := wiretest.Dial(b, srv.URL+c.topic, wiretest.LastID(c.cursor))
				cl.Hello()
				want := 100 // the replay window: the hub's ReplayLimit
				if c.cursor == 0 {
					want++ // and the gap before it
				}
				for range want {
					cl.NextNonHeartbeat()
				}
				cl.Close()
			}
		})
	}
}
