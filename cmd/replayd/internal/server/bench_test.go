package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// publishers is the number of concurrent publishers of the benchmarks.
const publishers = 64

// BenchmarkPublish compares, on one SQLite store per sub-benchmark, 64
// in-process publishers (hub.Publish) with 64 keep-alive HTTP clients
// posting one event per request, and with 64 clients posting 100 events
// per request. Each reports events/s.
//
//	cd cmd/replayd && go test -run '^$' -bench BenchmarkPublish -benchtime 3s ./internal/server
func BenchmarkPublish(b *testing.B) {
	b.Run("in-process", func(b *testing.B) {
		s, _ := newTestServer(b, "--publish-key", "k")
		run(b, 1, func(i int64) error {
			_, err := s.Hub().Publish(context.Background(), "room-1", i)
			return err
		})
	})
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("http-batch-%d", batch), func(b *testing.B) {
			_, srv := newTestServer(b, "--publish-key", "k")
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: publishers}}
			b.Cleanup(client.CloseIdleConnections)
			run(b, batch, func(i int64) error {
				var body bytes.Buffer
				if batch > 1 {
					body.WriteByte('[')
				}
				for j := range batch {
					if j > 0 {
						body.WriteByte(',')
					}
					fmt.Fprintf(&body, `{"topic":"room-1","data":%d}`, i*int64(batch)+int64(j))
				}
				if batch > 1 {
					body.WriteByte(']')
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/publish", &body)
				req.Header.Set("Authorization", "Bearer k")
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || strings.Contains(string(b), `"error"`) {
					return fmt.Errorf("%d %s", resp.StatusCode, b)
				}
				return nil
			})
		})
	}
}

// run calls op b.N times from publishers goroutines, each call publishing
// perOp events, and reports events/s.
func run(b *testing.B, perOp int, op func(i int64) error) {
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(i); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "events/s")
}
