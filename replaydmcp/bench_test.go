package replaydmcp

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/replaydpg"
)

// benchPayload is a progress notification as the SDK stores it.
var benchPayload = []byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"message":"step 42","progress":42,"progressToken":"p","total":1000}}`)

// benchStores are the stores the benchmarks pair, in one run: the SDK's
// memory store, and this one on a SQLite file and (with REPLAYD_PG_DSN)
// on PostgreSQL.
func benchStores(b *testing.B) []struct {
	name string
	open func(b *testing.B) mcp.EventStore
} {
	stores := []struct {
		name string
		open func(b *testing.B) mcp.EventStore
	}{
		{"memory", func(*testing.B) mcp.EventStore { return mcp.NewMemoryEventStore(nil) }},
		{"sqlite", func(b *testing.B) mcp.EventStore { return New(openSQLite(b, tempDB(b)), Options{}) }},
	}
	if os.Getenv("REPLAYD_PG_DSN") != "" {
		stores = append(stores, struct {
			name string
			open func(b *testing.B) mcp.EventStore
		}{"postgres", func(b *testing.B) mcp.EventStore {
			dsn, prefix := pgPrefix(b)
			st, err := replaydpg.Open(context.Background(), dsn, replaydpg.WithTablePrefix(prefix))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			return New(st, Options{})
		}})
	}
	return stores
}

// BenchmarkAppend is the cost of storing one message (a progress
// notification of 130 bytes), as the SDK's transport stores each message
// it sends: serial (one stream at a time), and parallel (a stream per
// goroutine, as concurrent requests do). Each Append of this store is one
// durable commit.
func BenchmarkAppend(b *testing.B) {
	ctx := context.Background()
	for _, st := range benchStores(b) {
		b.Run(st.name+"/serial", func(b *testing.B) {
			s := st.open(b)
			for i := range 3 {
				if err := s.Open(ctx, "S", fmt.Sprint(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(benchPayload)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := s.Append(ctx, "S", fmt.Sprint(i%3), benchPayload); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(st.name+"/parallel", func(b *testing.B) {
			s := st.open(b)
			var streams atomic.Int64
			b.SetBytes(int64(len(benchPayload)))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				stream := fmt.Sprint(streams.Add(1))
				if err := s.Open(ctx, "S", stream); err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					if err := s.Append(ctx, "S", stream, benchPayload); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkReplay is the cost of a resumption: After over a stream of 100
// messages, from its start, per message replayed.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	const n = 100
	for _, st := range benchStores(b) {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b)
			if err := s.Open(ctx, "S", "r"); err != nil {
				b.Fatal(err)
			}
			for range n {
				if err := s.Append(ctx, "S", "r", benchPayload); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				got := 0
				for _, err := range s.After(ctx, "S", "r", -1) {
					if err != nil {
						b.Fatal(err)
					}
					got++
				}
				if got != n {
					b.Fatalf("replayed %d, want %d", got, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
		})
	}
}
