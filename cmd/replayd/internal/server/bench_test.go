package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPublish measures the server's publish targets as ratios of
// figures taken in the same run on the same store: each iteration runs, one
// after the other, the same number of events published
//
//   - in-process: hub.Publish from the clients' goroutines (group commit);
//   - http-1: POST /publish, one event a request;
//   - http-100: POST /publish, an array of 100 events a request;
//   - raw-http: a handler that reads the body and writes a fixed answer,
//     on the same kind of listener and client: net/http's own ceiling.
//
// Each HTTP client is one goroutine on one keep-alive connection (the
// Transport keeps every connection idle between requests; the conns metric
// counts the connections the server accepted, which must equal clients).
// It reports events/s of each, the CPU time of the process per event (the
// clients and server together, in µs; steadier than rates on a loaded
// machine), the ratios the targets name: http-1/in-process (≥ 0.7) and
// http-100/http-1 (≥ 5), and net/http's own share: http-1/raw-http, and
// raw-http/in-process, the most http-1/in-process could be here.
//
//	cd cmd/replayd && go test -run '^$' -bench BenchmarkPublish -benchtime 5x -count 2 ./internal/server
func BenchmarkPublish(b *testing.B) {
	for _, clients := range []int{16, 64} {
		b.Run("clients="+strconv.Itoa(clients), func(b *testing.B) { benchPublish(b, clients) })
	}
}

// eventsPerPhase is how many events each mode publishes per iteration.
const eventsPerPhase = 12800

func benchPublish(b *testing.B, clients int) {
	s, srv := newTestServer(b, "--publish-key", "k")
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	raw := httptest.NewServer(http.HandlerFunc(rawPublish))
	b.Cleanup(raw.Close)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: clients, MaxIdleConnsPerHost: clients}}
	b.Cleanup(client.CloseIdleConnections)
	bodies := [2]*publishBodies{newPublishBodies(1), newPublishBodies(100)}

	type mode struct {
		name   string
		perOp  int
		op     func(i int64) error
		wall   time.Duration
		cpu    time.Duration
		events int
	}
	modes := []*mode{
		{name: "in-process", perOp: 1, op: func(i int64) error {
			_, err := s.Hub().Publish(context.Background(), "room-1", i)
			return err
		}},
		{name: "http-1", perOp: 1, op: func(i int64) error { return post(client, srv.URL, bodies[0].get(i)) }},
		{name: "http-100", perOp: 100, op: func(i int64) error { return post(client, srv.URL, bodies[1].get(i)) }},
		{name: "raw-http", perOp: 1, op: func(i int64) error { return post(client, raw.URL, bodies[0].get(i)) }},
	}
	b.ResetTimer()
	for range b.N {
		for _, m := range modes {
			cpu0 := cpuTime()
			t0 := time.Now()
			if err := runOps(clients, eventsPerPhase/m.perOp, m.op); err != nil {
				b.Fatalf("%s: %v", m.name, err)
			}
			m.wall += time.Since(t0)
			m.cpu += cpuTime() - cpu0
			m.events += eventsPerPhase
		}
	}
	b.StopTimer()
	rate := map[string]float64{}
	for _, m := range modes {
		rate[m.name] = float64(m.events) / m.wall.Seconds()
		b.ReportMetric(rate[m.name], m.name+"-events/s")
		b.ReportMetric(float64(m.cpu.Microseconds())/float64(m.events), m.name+"-cpu-µs/event")
	}
	b.ReportMetric(rate["http-1"]/rate["in-process"], "http-1/in-process")
	b.ReportMetric(rate["http-100"]/rate["http-1"], "http-100/http-1")
	b.ReportMetric(rate["http-1"]/rate["raw-http"], "http-1/raw-http")
	b.ReportMetric(rate["raw-http"]/rate["in-process"], "raw-http/in-process")
	b.ReportMetric(float64(conns.Load()), "conns")
	b.ReportMetric(0, "ns/op") // an iteration is a fixed set of phases, not an operation
}

// runOps calls op n times from clients goroutines.
func runOps(clients, n int, op func(i int64) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) || failed.Load() != nil {
					return
				}
				if err := op(i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	err, _ := failed.Load().(error)
	return err
}

// publishBodies are request bodies of perReq events each, built before
// the clock starts; get cycles through them.
type publishBodies struct{ bodies [][]byte }

func newPublishBodies(perReq int) *publishBodies {
	p := &publishBodies{}
	for i := range 64 {
		var body bytes.Buffer
		if perReq > 1 {
			body.WriteByte('[')
		}
		for j := range perReq {
			if j > 0 {
				body.WriteByte(',')
			}
			fmt.Fprintf(&body, `{"topic":"room-1","data":%d}`, i*perReq+j)
		}
		if perReq > 1 {
			body.WriteByte(']')
		}
		p.bodies = append(p.bodies, body.Bytes())
	}
	return p
}

func (p *publishBodies) get(i int64) []byte { return p.bodies[i%int64(len(p.bodies))] }

// post sends one publish request and checks its answer.
func post(client *http.Client, base string, body []byte) error {
	req, err := http.NewRequest(http.MethodPost, base+"/publish", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	ans, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || bytes.Contains(ans, []byte(`"error"`)) {
		return fmt.Errorf("%d %s", resp.StatusCode, ans)
	}
	return nil
}

// rawPublish is net/http's ceiling for a publish: read the body, answer a
// fixed JSON object.
func rawPublish(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	io.WriteString(w, `{"sequence":1,"id":"0198c9c4-0000-7000-8000-000000000000","duplicate":false}`+"\n")
}
