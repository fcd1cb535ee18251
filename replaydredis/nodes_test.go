package replaydredis

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
	"github.com/replayd/replayd/internal/nodetest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
	"github.com/replayd/replayd/storage"
)

// Three nodes (hubs on stores of their own, each tailing) on one Redis,
// with redis-server itself killed with SIGKILL and restarted three times
// while every node publishes, one prunes (to the newest 1,000), and
// clients hop between the nodes over SSE with their Last-Event-ID, over
// polls passing their cursor back, or both on one cursor (internal/nodetest's
// sixteen, as in TestNodesRedisProcesses). Redis runs with appendfsync always, so
// no acknowledged append is lost; each restart raises the sequence floor
// (another run_id). Publishes during an outage fail; their events are
// recorded as attempted. The chaos oracle (chaostest.Check) then holds
// every frame and poll answer to the ledger and the log: 0 violations. Each node's
// in-process gap subscriber gets every event still in the log in order,
// or a gap naming it: a node whose own publish committed while it could
// not read the rows below it (Redis died between the two) is told
// GapUnreadable for them, as the hub promises.
func TestNodesRedisKilled(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	srv := redisserver.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	prefix := testPrefix(t)
	tr := nodetest.NewTruth(seed)
	ledger, timeline := tr.Ledger, tr.Timeline

	const nodes = 3
	hubs := make([]*replayd.EventHub, nodes)
	cl := &nodetest.Cluster{Limit: 100, Outages: true} // the hubs' default ReplayLimit; 503 while Redis is down
	var subs []*gapSubscriber
	for i := range nodes {
		h := hubOn(t, openStore(t, srv.URL(), prefix))
		stop, err := h.StartTail(50*time.Millisecond, replayd.TailOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		subs = append(subs, subscribe(t, fmt.Sprintf("n%d", i), h, timeline))
		hs := httptest.NewServer(nodetest.Mux(h))
		t.Cleanup(hs.Close)
		hubs[i] = h
		cl.SetAddr(i, hs.URL, 1)
	}

	stop := make(chan struct{}) // the chaos phase is over
	var wg sync.WaitGroup

	// Publishers, one per node, and a pruner on node 1.
	topics := []string{"", "a", "b", "c"}
	for i, h := range hubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("n%d-%d", i, j)
				topic := topics[j%len(topics)]
				payload := json.RawMessage(fmt.Sprintf(`{"id":%q}`, id))
				ledger.Attempted(replayd.Event{EventID: id, Type: "message", Topic: topic, Payload: payload})
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				ev, err := h.Publish(ctx, topic, payload, replayd.WithEventID(id))
				cancel()
				if err == nil {
					ledger.Published(ev)
				}
				if j%8 == 0 {
					time.Sleep(time.Millisecond) // a publisher's pace, not a wait for a signal
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				hubs[1].Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 1000})
			}
		}
	}()

	// A reader records the log as it grows, for the rows whose publish
	// had no outcome (Redis died before its reply) and that a prune then
	// deletes before the end: clients may have received them.
	reader := openStore(t, srv.URL(), prefix)
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { <-stop; cancel() }()
		var cursor int64
		for ctx.Err() == nil {
			wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
			reader.WaitForAppend(wctx, cursor)
			wcancel()
			p, err := reader.Read(ctx, storage.ReadRequest{After: cursor, Limit: 1000})
			if err != nil {
				continue // Redis is down: the next wait paces the retry
			}
			for _, ev := range p.Events {
				ledger.Logged(ev)
				cursor = ev.Sequence
			}
		}
	}()

	// Clients: internal/nodetest's sixteen, hopping between the nodes
	// over SSE, polls, or both on one cursor.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients, stopClients := nodetest.StartClients(ctx, tr, cl, nodetest.Specs, nil)
	defer stopClients()

	// Redis killed and restarted, three times.
	for range 3 {
		time.Sleep(time.Duration(700+rng.IntN(800)) * time.Millisecond) // chaos phase: time passing is the point
		timeline.Add("redis-server killed")
		srv.Kill()
		time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
		srv.Restart()
		timeline.Add("redis-server restarted")
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	// The fence (for the gap subscribers), then every client reads to
	// the newest event of its scope.
	var fev replayd.Event
	for try := 0; ; try++ {
		ev, err := hubs[0].Publish(context.Background(), "", json.RawMessage(`"fence"`), replayd.WithEventID("fence"))
		if err == nil {
			fev = ev
			break
		}
		if try == 50 {
			t.Fatalf("publish the fence: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	ledger.Published(fev)
	nodetest.CatchUp(t, ctx, tr, clients, 60*time.Second)
	stopClients()
	if errs := tr.Errors(); len(errs) > 0 {
		t.Fatalf("%d failures, the first: %v", len(errs), errs[:min(len(errs), 10)])
	}
	for _, s := range subs {
		s.wait(t, fev.Sequence)
	}

	rep := tr.Check(t, hubs[2], clients)
	rows, _, err := chaostest.ReadLog(ctx, hubs[2])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		s.check(t, rows, fev.Sequence)
	}
	if rep.Resumes == 0 || rep.PollResumes == 0 {
		t.Errorf("%d SSE and %d poll resumes on another node: want some of each", rep.Resumes, rep.PollResumes)
	}
}

// gapSubscriber records what a hub's SubscribeWithGaps delivers: events
// and gaps, in order.
type gapSubscriber struct {
	name  string
	start int64
	mu    sync.Mutex
	seqs  []int64
	gaps  []replayd.Gap
	cond  chan struct{}
}

func subscribe(t *testing.T, name string, h *replayd.EventHub, tl *chaostest.Timeline) *gapSubscriber {
	s := &gapSubscriber{name: name, cond: make(chan struct{}, 1)}
	unsubscribe := h.SubscribeWithGaps(func(ev replayd.Event) {
		s.mu.Lock()
		s.seqs = append(s.seqs, ev.Sequence)
		s.mu.Unlock()
		select {
		case s.cond <- struct{}{}:
		default:
		}
	}, func(g replayd.Gap) {
		tl.Add(fmt.Sprintf("hub %s: gap %+v", name, g))
		s.mu.Lock()
		s.gaps = append(s.gaps, g)
		s.mu.Unlock()
	})
	t.Cleanup(unsubscribe)
	start, err := h.LatestSequence(ctxT(t)) // delivery starts above the live position, never above the head
	if err != nil {
		t.Fatal(err)
	}
	s.start = start
	return s
}

// wait waits, at most 30 s, until s has seen through.
func (s *gapSubscriber) wait(t *testing.T, through int64) {
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	for {
		s.mu.Lock()
		ok := len(s.seqs) > 0 && s.seqs[len(s.seqs)-1] >= through
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-s.cond:
		case <-timer.C:
			t.Errorf("subscriber of hub %s did not reach %d within 30 s", s.name, through)
			return
		}
	}
}

// check holds s to the log: strictly increasing, and every row still in
// the log above its start through the fence delivered or inside a gap it
// was told.
func (s *gapSubscriber) check(t *testing.T, rows []replayd.Event, fence int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := map[int64]bool{}
	for i, seq := range s.seqs {
		if i > 0 && seq <= s.seqs[i-1] {
			t.Errorf("subscriber of hub %s: %d after %d", s.name, seq, s.seqs[i-1])
		}
		got[seq] = true
	}
	told := 0
	for _, r := range rows {
		if r.Sequence <= s.start || r.Sequence > fence || got[r.Sequence] {
			continue
		}
		inGap := slices.ContainsFunc(s.gaps, func(g replayd.Gap) bool { return r.Sequence >= g.From && r.Sequence <= g.Through })
		if !inGap {
			t.Errorf("subscriber of hub %s (from %d) never got event %d (%s), and was told no gap over it; gaps %+v", s.name, s.start, r.Sequence, r.EventID, s.gaps)
		}
		told++
	}
	t.Logf("subscriber of hub %s: %d events, %d gaps over %d rows", s.name, len(s.seqs), len(s.gaps), told)
}
