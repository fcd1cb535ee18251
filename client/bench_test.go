package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
)

// errDone stops a benchmark's Run once it has what it came for.
var errDone = errors.New("done")

// consume runs a client from cursor until it has handled the event with id
// last, and returns how many events it handled.
func consume(b *testing.B, opts client.Options, cursor, last int64) int {
	opts.Cursor = cursor
	n := 0
	err := client.New(opts).Run(context.Background(), func(m client.Message) error {
		if m.Event == nil {
			b.Fatalf("unexpected gap %+v", m.Gap)
		}
		n++
		if m.Event.ID >= last {
			return errDone
		}
		return nil
	})
	if !errors.Is(err, errDone) {
		b.Fatal(err)
	}
	return n
}

// BenchmarkHub: one client consuming small events from a local hub (a
// SQLite file, real HTTP on loopback): the backlog of a log of 100,000
// events, read from cursor 0 over SSE (one replay) and over polls (pages
// of 1,000). The hub runs in the same process: allocs/op counts its
// allocations too (see BenchmarkClient for the client's own).
func BenchmarkHub(b *testing.B) {
	const size = 100_000
	s := newServer(b, replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: size}, Poll: replayd.PollOptions{MaxLimit: 1000}})
	var wg sync.WaitGroup
	for w := range 50 {
		wg.Go(func() {
			for i := range size / 50 {
				if _, err := s.hub.Load().Publish(context.Background(), "a", []byte(`{"n":`+strconv.Itoa(w*size+i)+`}`)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	head, err := s.hub.Load().LatestSequence(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		b.Run(string(tr), func(b *testing.B) {
			opts := s.options(tr, "a")
			opts.PollLimit = 1000
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for left := b.N; left > 0; {
				k := min(left, size)
				if got := consume(b, opts, head-int64(k), head); got != k {
					b.Fatalf("%d events, want %d", got, k)
				}
				left -= k
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
}

// BenchmarkClient: the client's own cost per event, against a server that
// writes a stream of small events (or poll answers of 1,000) from memory
// without allocating.
func BenchmarkClient(b *testing.B) {
	var total int64 // the events the server has to send, set before each Run
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cursor, _ := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64)
		if r.URL.Path == "/poll" {
			cursor, _ = strconv.ParseInt(r.URL.Query().Get("cursor"), 10, 64)
			last := min(cursor+1000, total)
			w.Header().Set("Content-Type", "application/json")
			buf := make([]byte, 0, 64<<10)
			buf = append(buf, `{"topics":["a"],"cursor":`...)
			buf = strconv.AppendInt(buf, last, 10)
			buf = append(buf, `,"head":`...)
			buf = strconv.AppendInt(buf, total, 10)
			buf = append(buf, `,"more":`...)
			buf = strconv.AppendBool(buf, last < total)
			buf = append(buf, `,"gap":null,"events":[`...)
			for id := cursor + 1; id <= last; id++ {
				if id > cursor+1 {
					buf = append(buf, ',')
				}
				buf = append(buf, `{"id":`...)
				buf = strconv.AppendInt(buf, id, 10)
				buf = append(buf, `,"type":"message","topic":"a","data":{"n":`...)
				buf = strconv.AppendInt(buf, id, 10)
				buf = append(buf, `}}`...)
			}
			w.Write(append(buf, "]}"...))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		buf := make([]byte, 0, 64<<10)
		buf = append(buf, "id: "...)
		buf = strconv.AppendInt(buf, cursor, 10)
		buf = append(buf, "\nevent: hello\ndata: {\"topic\":\"a\",\"topics\":[\"a\"],\"cursor\":"...)
		buf = strconv.AppendInt(buf, cursor, 10)
		buf = append(buf, "}\n\n"...)
		for id := cursor + 1; id <= total; id++ {
			buf = append(buf, "id: "...)
			buf = strconv.AppendInt(buf, id, 10)
			buf = append(buf, "\nevent: message\ndata: {\"n\":"...)
			buf = strconv.AppendInt(buf, id, 10)
			buf = append(buf, "}\n\n"...)
			if len(buf) > 60<<10 {
				if _, err := w.Write(buf); err != nil {
					return
				}
				buf = buf[:0]
			}
		}
		w.Write(buf)
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	b.Cleanup(srv.Close)
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		b.Run(string(tr), func(b *testing.B) {
			opts := client.Options{SSE: srv.URL + "/events", Poll: srv.URL + "/poll", Transport: tr, Topics: []string{"a"}}
			total = int64(b.N)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			if got := consume(b, opts, 0, total); got != b.N {
				b.Fatalf("%d events, want %d", got, b.N)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
}
