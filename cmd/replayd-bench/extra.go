package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"runtime/pprof"
	"sync"
	"time"
)

// The phases of issues 9 and 10 (multitopic.go, poll.go), kept out of the
// shared files: their sizes, their registration, and their server-side
// endpoints.

// extraConfig sizes the multitopic and poll phases.
type extraConfig struct {
	MultiClients int // clients in the multi-topic fan-out
	MultiFrames  int // frames to deliver per fan-out measurement
	MultiPairs   int // rounds of 1, 4, 4, 1 topics (ABBA); 0: one of each

	WaitPolls  int           // waiting long polls (and idle SSE streams to compare)
	WaitSettle time.Duration // wait before reading RSS

	PollClients int           // clients polling in a loop
	PollLimit   int           // limit of each poll
	PollBacklog int           // events published before the measurement
	PollRate    int           // events/s published during it
	PollWarm    time.Duration // polling before the window opens
	PollDur     time.Duration // the measurement window
}

var extraSizes = map[string]extraConfig{
	"full": {
		MultiClients: 1000, MultiFrames: 3_000_000, MultiPairs: 2,
		WaitPolls: 10_000, WaitSettle: time.Second,
		PollClients: 200, PollLimit: 10, PollBacklog: 20_000, PollRate: 500,
		PollWarm: 500 * time.Millisecond, PollDur: 3 * time.Second,
	},
	"quick": {
		MultiClients: 1000, MultiFrames: 300_000, MultiPairs: 1,
		WaitPolls: 2000, WaitSettle: 500 * time.Millisecond,
		PollClients: 200, PollLimit: 10, PollBacklog: 5000, PollRate: 500,
		PollWarm: 200 * time.Millisecond, PollDur: time.Second,
	},
	"tiny": {
		MultiClients: 5, MultiFrames: 500, MultiPairs: 0,
		WaitPolls: 20, WaitSettle: 20 * time.Millisecond,
		PollClients: 4, PollLimit: 10, PollBacklog: 200, PollRate: 100,
		PollWarm: 50 * time.Millisecond, PollDur: 200 * time.Millisecond,
	},
}

// extraPhases are the phases this file's siblings add; main.go's phase
// dispatches to them.
var extraPhases = map[string]func(b *bench, ctx context.Context) error{
	"multitopic": (*bench).multitopicPhase,
	"pollwait":   (*bench).pollWaitPhase,
	"pollrate":   (*bench).pollRatePhase,
}

func init() {
	allPhases = append(allPhases, "multitopic", "pollwait", "pollrate")
}

// registerExtra mounts the poll endpoint (the hub's PollHandler, or the raw
// ceiling's fixed answer) and the control endpoints the poll phases use.
func (s *server) registerExtra(mux *http.ServeMux) {
	if s.hub != nil {
		mux.Handle("/poll", s.hub.PollHandler())
		mux.HandleFunc("/ctl/conns", s.handleConns)
	} else {
		rp := &rawPoll{}
		mux.Handle("/poll", rp)
		mux.HandleFunc("/ctl/pollbody", rp.setBody)
	}
	mux.HandleFunc("/ctl/profile", handleProfile)
}

// profileEnv names a directory: when set, the poll throughput phase takes a
// CPU profile of the server over its window into it (go tool pprof).
const profileEnv = "REPLAYD_BENCH_PROFILE"

// handleProfile writes a CPU profile of ?dur= to the file ?out=.
func handleProfile(w http.ResponseWriter, r *http.Request) {
	f, err := os.Create(r.URL.Query().Get("out"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	t := time.NewTimer(queryDur(r, "dur", time.Second))
	select {
	case <-t.C:
	case <-r.Context().Done():
		t.Stop()
	}
	pprof.StopCPUProfile()
	writeJSON(w, struct{}{})
}

// connCounts is what /ctl/conns answers: the hub's open SSE streams and
// waiting long polls, from its metrics.
type connCounts struct {
	SSE  int64 `json:"sse"`
	Poll int64 `json:"poll"`
}

func (s *server) handleConns(w http.ResponseWriter, r *http.Request) {
	m := s.hub.Metrics()
	writeJSON(w, connCounts{SSE: m.SSEConnections, Poll: m.PollConnections})
}

// rawPoll is the poll throughput ceiling: a net/http handler answering every
// request with one fixed JSON body (set by POST /ctl/pollbody, a real poll
// answer captured from the hub), written the way the poll handler writes
// its answers.
type rawPoll struct {
	mu   sync.RWMutex
	body []byte
}

func (p *rawPoll) setBody(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.body = b
	p.mu.Unlock()
	writeJSON(w, struct{}{})
}

func (p *rawPoll) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.RLock()
	body := p.body
	p.mu.RUnlock()
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}
