package replayd

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The chaos test: SPEC §1 under disorder. Publishers, SSE clients, pruning,
// a second hub tailing the same file, slow consumers, server-side kills and
// hub restarts all run at once for -chaos.duration; every frame every
// connection received is then checked against a ledger of what was
// published. Every random choice comes from -chaos.seed, so a failing seed
// replays the same decisions (the interleaving is the scheduler's).
//
//	go test -run '^TestChaos$' -chaos.seed=42 -chaos.duration=5m .

var (
	chaosSeedFlag     = flag.Uint64("chaos.seed", 0, "seed of TestChaos and TestCrashDurability (0: from the clock)")
	chaosDurationFlag = flag.Duration("chaos.duration", 0, "how long TestChaos runs its chaos phase (0: 20s, 2s with -short)")
)

// chaosSeed returns the seed to use and logs it, so any failure can be
// replayed.
func chaosSeed(t *testing.T) uint64 {
	seed := *chaosSeedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -chaos.seed=%d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: rerun with -run '^%s$' -chaos.seed=%d", seed, t.Name(), seed)
		}
	})
	return seed
}

const (
	chaosPublishers = 4
	chaosClients    = 28
	chaosFinishTime = 40 * time.Second // bound on reaching the fence after the chaos phase
	// chaosPublishTimeout bounds every Publish: one that hangs (on a hub
	// closed under it, say) fails the test instead of hanging it.
	chaosPublishTimeout = 30 * time.Second
)

var chaosTopics = []string{"t0", "t1", "t2", "t3", "t4"}

// chaosEnv is one run's shared state.
type chaosEnv struct {
	t     *testing.T
	seed  uint64
	start time.Time

	db, dbB      *sql.DB
	hubA         *EventHub
	hubB         atomic.Pointer[EventHub] // replaced by restarts
	optsA, optsB Options
	limitA       int // effective replay limits
	limitB       int
	urlA, urlB   string
	httpc        *http.Client

	ledger   chaosLedger
	timeline chaosTimeline

	stop           chan struct{} // closed when the chaos phase ends
	finish         chan struct{} // closed once the fence is published
	finishDeadline chan struct{} // closed when clients must give up on the fence
	fence          atomic.Int64

	// Admission on hub A: Authorize refuses every scope that names a topic
	// of denied ("" stands for the global scope), and MaxConnections is
	// small enough to refuse some requests with the overload answer.
	denied        map[string]bool
	overloadRetry time.Duration

	connSeq atomic.Int64
	polls   chaosPollState // chaos_poll_test.go
	stats   struct {
		publishes, retries, retriesSame, retriesNew, publishB atomic.Int64
		pruneCalls, pruned, restarts, resyncs                 atomic.Int64
		badStatus, dropped                                    atomic.Int64
		forbidden, overloaded, servedAfterOverload            atomic.Int64
	}
}

// TestChaos runs the chaos phase and checks SPEC §1 for every connection.
func TestChaos(t *testing.T) {
	seed := chaosSeed(t)
	duration := *chaosDurationFlag
	if duration <= 0 {
		duration = 20 * time.Second
		if testing.Short() {
			duration = 2 * time.Second
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	e := &chaosEnv{
		t: t, seed: seed,
		stop:           make(chan struct{}),
		finish:         make(chan struct{}),
		finishDeadline: make(chan struct{}),
	}
	e.ledger.bySeq = map[int64]chaosEntry{}
	e.ledger.byID = map[string]int64{}
	e.ledger.renewed = map[int64]struct{}{}

	var path string
	e.db, path = openTestDB(t)
	dbB, err := OpenDB(path) // the second hub has its own pool, as another process would
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dbB.Close() })
	e.dbB = dbB

	e.denied = map[string]bool{"": rng.IntN(4) == 0} // "": the global scope
	for _, i := range rng.Perm(len(chaosTopics))[:1+rng.IntN(2)] {
		e.denied[chaosTopics[i]] = true
	}
	e.overloadRetry = 50 * time.Millisecond
	e.optsA = Options{
		SSE: SSEOptions{
			ReplayLimit:       []int{10, 40, 100}[rng.IntN(3)],
			HeartbeatInterval: 250 * time.Millisecond,
			Retry:             time.Second,
			MaxBufferedBytes:  48 << 10, // slow readers get disconnected here
			// About 60% of 28 clients use hub A: a cap of 12 to 17 bites
			// now and then, and more while the clients wait for the fence.
			MaxConnections: 12 + rng.IntN(6),
			OverloadRetry:  e.overloadRetry,
		},
		Authorize: func(r *http.Request, topics []string) error {
			if len(topics) == 0 && e.denied[""] {
				return errors.New("chaos: the global scope is denied")
			}
			for _, topic := range topics {
				if e.denied[topic] {
					return fmt.Errorf("chaos: topic %q is denied", topic)
				}
			}
			return nil
		},
	}
	e.optsB = Options{SSE: SSEOptions{
		ReplayLimit:       []int{-1, 25, 300}[rng.IntN(3)],
		HeartbeatInterval: 100 * time.Millisecond,
		MaxBufferedBytes:  256 << 10,
	}}
	e.limitA, e.limitB = max(e.optsA.SSE.ReplayLimit, 0), max(e.optsB.SSE.ReplayLimit, 0)
	t.Logf("duration %v; hub A replay limit %d, max connections %d, denied scopes %v; hub B replay limit %d",
		duration, e.limitA, e.optsA.SSE.MaxConnections, e.denied, e.limitB)

	e.hubA = newTestHub(t, e.db, e.optsA)
	subA := chaosSubscribe(e.hubA)
	firstB, subB := e.newHubB(rng)
	e.hubB.Store(firstB)

	muxA := http.NewServeMux()
	muxA.Handle("/events", e.hubA.Handler())
	muxA.Handle("/poll", e.hubA.PollHandler())
	e.urlA = chaosServe(t, muxA)
	e.urlB = chaosServe(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/poll" {
			e.hubB.Load().PollHandler().ServeHTTP(w, r)
			return
		}
		e.hubB.Load().Handler().ServeHTTP(w, r)
	}))
	transport := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetReadBuffer(16 << 10) // a reader that stops reading stalls the server soon
			}
			return c, err
		},
	}
	t.Cleanup(transport.CloseIdleConnections)
	e.httpc = &http.Client{Transport: transport}

	e.start = time.Now()
	// The storm phase: storms of handshakes from cursor 0 while a large log
	// is being published (nothing is pruned yet, so every storm has the
	// whole log above its cursor to count and replay).
	prefill := 5_000
	if testing.Short() {
		prefill = 1_500
	}
	stormStop := make(chan struct{})
	stormed := make(chan []*chaosConn, 1)
	go func() { stormed <- e.stormer(rand.New(rand.NewPCG(seed, 400)), stormStop) }()
	e.prefill(prefill)
	close(stormStop)
	storms := <-stormed
	t.Logf("storm phase: %d events published while %d connections stormed in from cursor 0, in %v",
		prefill, len(storms), time.Since(e.start).Round(time.Millisecond))

	var wg sync.WaitGroup // publishers, pruner, restarter
	for p := range chaosPublishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.publisher(p, rand.New(rand.NewPCG(seed, uint64(100+p))))
		}()
	}
	for p := range 2 { // two, so prunes also overlap each other
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.pruner(rand.New(rand.NewPCG(seed, uint64(200+p))))
		}()
	}
	wg.Add(1)
	var lastSubB *chaosSub
	go func() {
		defer wg.Done()
		lastSubB = e.restarter(rand.New(rand.NewPCG(seed, 300)), subB)
	}()
	var cwg sync.WaitGroup
	results := make([]chaosClientResult, chaosClients)
	for c := range chaosClients {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			results[c] = e.client(c, rand.New(rand.NewPCG(seed, uint64(1000+c))))
		}()
	}
	e.startPollClients(seed, &cwg)

	phase := time.NewTimer(duration)
	<-phase.C
	close(e.stop)
	wg.Wait()
	// Every publisher has returned: publish the fence, a broadcast every
	// client must reach, and let the clients finish.
	fence := e.publish(e.hubA, "", map[string]string{"fence": "end"}, WithType("fence"))
	e.fence.Store(fence.Sequence)
	close(e.finish)
	finishTimer := time.AfterFunc(chaosFinishTime, func() { close(e.finishDeadline) })
	cwg.Wait()
	if !finishTimer.Stop() {
		t.Errorf("clients did not all reach the fence within %v", chaosFinishTime)
	}
	chaosWaitSub(t, lastSubB, fence.Sequence)
	chaosWaitSub(t, subA, fence.Sequence)
	chaosPhaseEnd := time.Since(e.start)
	// The storms' connections are checked like any other; they need not
	// reach the fence.
	results = append(results, chaosClientResult{conns: storms, reachedFence: true})

	e.check(results, subA, lastSubB, chaosPhaseEnd)
}

// newHubB creates a second hub on the same file, through the second pool,
// tailing. Its subscriber records its live deliveries.
func (e *chaosEnv) newHubB(rng *rand.Rand) (*EventHub, *chaosSub) {
	h := newTestHub(e.t, e.dbB, e.optsB)
	sub := chaosSubscribe(h)
	// Slow enough at times that an aggressive prune deletes rows it has not
	// read yet.
	interval := time.Duration(2+rng.IntN(60)) * time.Millisecond
	if _, err := h.StartTail(interval, TailOptions{MaxInterval: 5 * interval}); err != nil {
		e.t.Fatal(err)
	}
	return h, sub
}

// chaosServe starts a real HTTP server whose accepted connections have a
// small send buffer, so a client that stops reading backs frames up into
// the hub's per-connection queue quickly.
func chaosServe(t *testing.T, h http.Handler) string {
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = chaosListener{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

type chaosListener struct{ net.Listener }

func (l chaosListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

// ---- publishing, pruning, restarts ----

// publish publishes on h and records the result in the ledger; an error
// fails the test.
func (e *chaosEnv) publish(h *EventHub, topic string, payload any, opts ...PublishOption) Event {
	ctx, cancel := context.WithTimeout(context.Background(), chaosPublishTimeout)
	defer cancel()
	ev, err := h.Publish(ctx, topic, payload, opts...)
	if err != nil {
		e.t.Errorf("publish on hub A: %v", err)
		return ev
	}
	e.ledger.add(e.t, ev)
	return ev
}

// prefill publishes n events on hub A from many goroutines at once.
func (e *chaosEnv) prefill(n int) {
	const workers = 32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				topic := ""
				if i%7 != 0 {
					topic = chaosTopics[i%len(chaosTopics)]
				}
				e.publish(e.hubA, topic, map[string]int{"prefill": i})
			}
		}()
	}
	wg.Wait()
}

// chaosStormSize is how many connections one handshake storm opens at once.
const chaosStormSize = 24

// stormer opens storms of connections resuming from cursor 0 (every event
// of the log above it to count, replay or name in a gap) on either hub,
// one after another with short pauses, until stop is closed and at least
// two storms ran. It returns the connections for the checker. Each reads
// for a short while and drops.
func (e *chaosEnv) stormer(rng *rand.Rand, stop <-chan struct{}) []*chaosConn {
	var conns []*chaosConn
	for storm := 0; ; storm++ {
		if storm >= 2 {
			wait := time.NewTimer(time.Duration(10+rng.IntN(100)) * time.Millisecond)
			select {
			case <-stop:
				wait.Stop()
				return conns
			case <-wait.C:
			}
		}
		var wg sync.WaitGroup
		for range chaosStormSize {
			c := &chaosConn{id: int(e.connSeq.Add(1)), client: -1, hub: "A", mode: "stale", sent: "0", via: "header", behaviour: "storm"}
			if rng.IntN(3) == 0 {
				c.hub = "B"
			}
			c.topics = chaosScope(rng)
			life := time.Duration(50+rng.IntN(400)) * time.Millisecond
			conns = append(conns, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.run(c, "", life, 0, 0, 0)
			}()
		}
		wg.Wait()
	}
}

// publisher publishes until the chaos phase ends: random topics and
// broadcasts, random types, multi-line payloads, some with an event id,
// some of those retried (at once, or much later, perhaps after the
// original was pruned), and some through hub B.
func (e *chaosEnv) publisher(p int, rng *rand.Rand) {
	var ids []string // event ids used, for retries
	for n := 0; ; n++ {
		select {
		case <-e.stop:
			return
		default:
		}
		topic := chaosTopics[rng.IntN(len(chaosTopics))]
		if rng.IntN(6) == 0 {
			topic = ""
		}
		typ := []string{"message", "update", "note.created"}[rng.IntN(3)]
		payload := chaosPayload(rng, p, n)
		var opts []PublishOption
		opts = append(opts, WithType(typ))
		retry, prior := "", int64(0)
		switch r := rng.IntN(20); {
		case r < 3:
			id := fmt.Sprintf("pub%d-%d", p, n)
			ids = append(ids, id)
			opts = append(opts, WithEventID(id))
		case r < 5 && len(ids) > 0:
			retry = ids[rng.IntN(len(ids))]
			if rng.IntN(2) == 0 {
				retry = ids[len(ids)-1]
			}
			prior = e.ledger.seqOf(retry)
			opts = append(opts, WithEventID(retry))
		}
		var ev Event
		if rng.IntN(10) == 0 {
			// Through hub B, which may be restarting: an event id makes
			// the retry safe.
			if retry == "" {
				id := fmt.Sprintf("pubB%d-%d", p, n)
				opts = append(opts, WithEventID(id))
			}
			ev = e.publishB(topic, payload, opts)
		} else {
			ev = e.publish(e.hubA, topic, payload, opts...)
		}
		if retry != "" && ev.Sequence > 0 && prior > 0 {
			e.noteRetry(retry, prior, ev)
		}
		e.stats.publishes.Add(1)
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // pacing, not synchronisation
		}
	}
}

// publishB publishes through the current hub B, retrying on a hub that a
// restart closed.
func (e *chaosEnv) publishB(topic string, payload any, opts []PublishOption) Event {
	e.stats.publishB.Add(1)
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), chaosPublishTimeout)
		ev, err := e.hubB.Load().Publish(ctx, topic, payload, opts...)
		cancel()
		if errors.Is(err, ErrClosed) {
			continue // the restarter has stored a new hub before closing the old one
		}
		if err != nil {
			e.t.Errorf("publish on hub B: %v", err)
			return ev
		}
		e.ledger.add(e.t, ev)
		return ev
	}
	e.t.Errorf("publish on hub B: closed 100 times in a row")
	return Event{}
}

// noteRetry checks a publish that reused an event id whose newest row was
// prior: it returns that row, unless the row was pruned meanwhile, when it
// stores a new one (the check at the end confirms prior is gone).
func (e *chaosEnv) noteRetry(id string, prior int64, ev Event) {
	e.stats.retries.Add(1)
	switch {
	case ev.EventID != id:
		e.t.Errorf("retry of %s returned event %s", id, ev.EventID)
	case ev.Sequence == prior:
		e.stats.retriesSame.Add(1)
	case ev.Sequence > prior:
		e.stats.retriesNew.Add(1)
		e.ledger.mu.Lock()
		e.ledger.renewed[prior] = struct{}{}
		e.ledger.mu.Unlock()
	default:
		e.t.Errorf("retry of %s returned %d, below its row %d", id, ev.Sequence, prior)
	}
}

// chaosPayload is a JSON object naming its publisher, sometimes padded,
// sometimes spread over several lines.
func chaosPayload(rng *rand.Rand, p, n int) json.RawMessage {
	pad := strings.Repeat("x", rng.IntN(400))
	if rng.IntN(8) == 0 {
		return json.RawMessage(fmt.Sprintf("{\n  \"p\": %d,\n  \"n\": %d,\n  \"pad\": %q\n}", p, n, pad))
	}
	return json.RawMessage(fmt.Sprintf(`{"p":%d,"n":%d,"pad":%q}`, p, n, pad))
}

// pruner calls Prune on either hub, by count or by age, until the chaos
// phase ends.
func (e *chaosEnv) pruner(rng *rand.Rand) {
	for {
		wait := time.NewTimer(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		select {
		case <-e.stop:
			wait.Stop()
			return
		case <-wait.C:
		}
		var policy RetentionPolicy
		switch rng.IntN(10) {
		case 0, 1, 2:
			policy.MaxAge = time.Duration(500+rng.IntN(6000)) * time.Millisecond
		case 3:
			// Nearly everything: rows a tailing hub has not read yet go too.
			policy.MaxEvents = int64(1 + rng.IntN(10))
		default:
			policy.MaxEvents = int64(50 + rng.IntN(3000))
		}
		h, name := e.hubA, "A"
		if rng.IntN(3) == 0 {
			h, name = e.hubB.Load(), "B"
		}
		n, err := h.Prune(context.Background(), policy)
		if err != nil && !errors.Is(err, ErrClosed) {
			e.t.Errorf("prune on hub %s: %v", name, err)
		}
		e.stats.pruneCalls.Add(1)
		e.stats.pruned.Add(n)
		e.timeline.add(e, fmt.Sprintf("prune on hub %s %+v: %d deleted", name, policy, n))
	}
}

// restarter replaces hub B with a new one now and then (closing the old
// one ends its streams) and makes hub A disconnect all its streams now and
// then. It returns the subscriber of the last hub B.
func (e *chaosEnv) restarter(rng *rand.Rand, sub *chaosSub) *chaosSub {
	for {
		wait := time.NewTimer(time.Duration(700+rng.IntN(2500)) * time.Millisecond)
		select {
		case <-e.stop:
			wait.Stop()
			return sub
		case <-wait.C:
		}
		if rng.IntN(3) == 0 {
			e.hubA.resync()
			e.stats.resyncs.Add(1)
			e.timeline.add(e, "hub A disconnects every stream")
			continue
		}
		var h *EventHub
		h, sub = e.newHubB(rng)
		old := e.hubB.Swap(h)
		old.Close()
		e.stats.restarts.Add(1)
		e.timeline.add(e, "hub B restarted")
	}
}

// ---- in-process subscribers ----

// chaosSub records what a hub's Subscribe delivers.
type chaosSub struct {
	start int64 // the hub's live position when it subscribed
	mu    sync.Mutex
	seqs  []int64
	cond  chan struct{} // signalled on every delivery
}

func chaosSubscribe(h *EventHub) *chaosSub {
	h.live.mu.Lock()
	s := &chaosSub{start: h.live.pos, cond: make(chan struct{}, 1)}
	h.live.mu.Unlock()
	h.Subscribe(func(ev Event) {
		s.mu.Lock()
		s.seqs = append(s.seqs, ev.Sequence)
		s.mu.Unlock()
		select {
		case s.cond <- struct{}{}:
		default:
		}
	})
	return s
}

// chaosWaitSub waits until s has seen through, bounded.
func chaosWaitSub(t *testing.T, s *chaosSub, through int64) {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		s.mu.Lock()
		n := len(s.seqs)
		last := int64(0)
		if n > 0 {
			last = s.seqs[n-1]
		}
		s.mu.Unlock()
		if last >= through {
			return
		}
		select {
		case <-s.cond:
		case <-timer.C:
			t.Errorf("subscriber stuck at %d, waiting for %d", last, through)
			return
		}
	}
}

// ---- the ledger ----

// chaosEntry is what the ledger knows of one sequence.
type chaosEntry struct {
	topic, typ, eventID string
	hash                uint64 // of type and data as a client sees them
}

// chaosLedger is every event Publish returned, by sequence.
type chaosLedger struct {
	mu      sync.Mutex
	bySeq   map[int64]chaosEntry
	polled  map[int64]uint64   // sequence → hash of type and data as a poll answer carries them
	byID    map[string]int64   // event id → the newest sequence returned for it
	renewed map[int64]struct{} // originals a retry replaced with a new row
}

func chaosHash(typ, data string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(typ))
	h.Write([]byte{0})
	h.Write([]byte(data))
	return h.Sum64()
}

func (l *chaosLedger) add(t *testing.T, ev Event) {
	en := chaosEntry{topic: ev.Topic, typ: ev.Type, eventID: ev.EventID, hash: chaosHash(ev.Type, string(ev.Payload))}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.bySeq[ev.Sequence]; ok && old != en {
		t.Errorf("Publish returned two different events for sequence %d: %+v and %+v", ev.Sequence, old, en)
	}
	l.bySeq[ev.Sequence] = en
	if l.polled == nil {
		l.polled = map[int64]uint64{}
	}
	l.polled[ev.Sequence] = chaosPollHash(ev.Type, ev.Payload)
	l.byID[ev.EventID] = max(l.byID[ev.EventID], ev.Sequence)
}

// seqOf returns the newest sequence returned for event id, 0 if none.
func (l *chaosLedger) seqOf(id string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byID[id]
}

func (l *chaosLedger) max() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m int64
	for s := range l.bySeq {
		m = max(m, s)
	}
	return m
}

// ---- the timeline ----

type chaosTimeline struct {
	mu      sync.Mutex
	entries []chaosMoment
}

type chaosMoment struct {
	at   time.Duration
	what string
}

func (tl *chaosTimeline) add(e *chaosEnv, what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.entries = append(tl.entries, chaosMoment{time.Since(e.start), what})
}

// ---- clients ----

// chaosConn is one SSE connection and every frame it received.
type chaosConn struct {
	id, client  int
	hub         string   // "A" or "B"
	topics      []string // the scope; none: global
	mode        string   // fresh, resume, stale, future, invalid
	sent        string   // the cursor sent, "" for none
	via         string   // "header" or "query"
	behaviour   string
	status      int
	overloaded  bool // refused by hub A's MaxConnections: only a retry, then the end
	frames      []chaosFrame
	heartbeats  int
	end         string
	start, stop time.Duration
}

// chaosFrame is one received frame, reduced to what the checker needs.
type chaosFrame struct {
	kind byte // 'r' retry, 'h' hello, 'g' gap, 'e' event, '?' anything else
	seq  int64
	hash uint64
	data string // hello, gap and unexpected frames
}

type chaosClientResult struct {
	conns        []*chaosConn
	reachedFence bool
}

// client connects, reads and drops in a loop until the chaos phase ends,
// then reconnects until one of its connections reaches the fence.
func (e *chaosEnv) client(idx int, rng *rand.Rand) chaosClientResult {
	var res chaosClientResult
	lastID := ""
	sticky := idx%5 == 0 // a few clients mostly stay connected
	for {
		finishing := false
		select {
		case <-e.finish:
			finishing = true
		default:
		}
		select {
		case <-e.finishDeadline:
			return res
		default:
		}
		c := &chaosConn{id: int(e.connSeq.Add(1)), client: idx}
		c.hub = "A"
		if rng.IntN(5) < 2 {
			c.hub = "B"
		}
		c.topics = chaosScope(rng)
		switch r := rng.IntN(20); {
		case finishing && lastID != "", r < 10 && lastID != "":
			c.mode, c.sent = "resume", lastID
		case r < 13:
			c.mode = "fresh"
		case r < 17:
			c.mode = "stale"
			c.sent = strconv.FormatInt(rng.Int64N(e.ledger.max()+1), 10)
		case r < 18:
			c.mode = "future"
			c.sent = strconv.FormatInt(e.ledger.max()+1_000_000+rng.Int64N(1000), 10)
		default:
			c.mode = "invalid"
			c.sent = []string{"abc", "-1", "1.5", "+3", "18446744073709551616", "9223372036854775808", "0x1f", "1e3", "٣"}[rng.IntN(9)]
		}
		if c.mode == "fresh" && !finishing && rng.IntN(3) == 0 {
			if id := e.pollCursor(rng); id != "" { // one cursor for both transports
				c.mode, c.sent = "poll", id
			}
		}
		c.via = "header"
		if rng.IntN(4) == 0 {
			c.via = "query"
		}
		// How this connection reads and when it drops.
		var life time.Duration // 0: until the server ends it or the finish
		var closeAfter int     // close after this many frames; 0: never
		var pauseAfter int     // stop reading after this many frames...
		var pause time.Duration
		switch r := rng.IntN(10); {
		case sticky && r < 7:
			c.behaviour = "stay"
		case r < 4:
			c.behaviour = "timed"
			life = time.Duration(20+rng.IntN(1000)) * time.Millisecond
		case r < 6:
			c.behaviour = "count"
			closeAfter = 1 + rng.IntN(150)
		case r < 9:
			c.behaviour = "slow"
			pauseAfter = 1 + rng.IntN(20)
			pause = time.Duration(300+rng.IntN(2000)) * time.Millisecond
			life = pause + time.Duration(rng.IntN(1000))*time.Millisecond
		default:
			c.behaviour = "stay"
		}
		if finishing {
			life, closeAfter, pauseAfter = 0, 0, 0
		}
		reached := e.run(c, lastID, life, closeAfter, pauseAfter, pause)
		res.conns = append(res.conns, c)
		for c.overloaded && !reached {
			// Refused by the overload answer: an EventSource comes back
			// after the retry it was told, with the same request (the
			// answer carried no id).
			if !e.overloadWait(c) {
				return res
			}
			prev := c
			c = &chaosConn{id: int(e.connSeq.Add(1)), client: idx, hub: prev.hub, topics: prev.topics,
				mode: prev.mode, sent: prev.sent, via: prev.via, behaviour: prev.behaviour}
			select {
			case <-e.finish:
				life, closeAfter, pauseAfter = 0, 0, 0
			default:
			}
			reached = e.run(c, lastID, life, closeAfter, pauseAfter, pause)
			res.conns = append(res.conns, c)
			if !c.overloaded && c.status == http.StatusOK {
				e.stats.servedAfterOverload.Add(1)
			}
		}
		// The next connection resumes from the last id this one received,
		// as an EventSource would.
		lastID = chaosLastID(c, lastID)
		e.polls.sseLast[idx].Store(lastID)
		if reached {
			res.reachedFence = true
			return res
		}
		if c.status != http.StatusOK {
			// Dropped before the response, or refused (a failure, reported
			// above): retry shortly.
			backoff := time.NewTimer(time.Duration(5+rng.IntN(20)) * time.Millisecond)
			select {
			case <-backoff.C:
			case <-e.finishDeadline:
				backoff.Stop()
			}
		}
	}
}

// chaosLastID returns the id a client resumes from after c: the last id c
// received, or lastID if it received none.
func chaosLastID(c *chaosConn, lastID string) string {
	for _, f := range c.frames {
		if f.kind == 'h' || f.kind == 'e' {
			lastID = strconv.FormatInt(f.seq, 10)
		}
	}
	return lastID
}

// overloadWait waits the retry the overload answer told c, as an
// EventSource would; false if the finish deadline came first.
func (e *chaosEnv) overloadWait(c *chaosConn) bool {
	ms, _ := strconv.ParseInt(c.frames[0].data, 10, 64)
	wait := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer wait.Stop()
	select {
	case <-wait.C:
		return true
	case <-e.finishDeadline:
		return false
	}
}

// run makes one connection and reads it until it is done; it reports
// whether the connection reached the fence.
func (e *chaosEnv) run(c *chaosConn, lastID string, life time.Duration, closeAfter, pauseAfter int, pause time.Duration) (reached bool) {
	c.start = time.Since(e.start)
	defer func() {
		c.stop = time.Since(e.start)
		// Hub A's streams begin with "retry: 1000"; the overload answer's
		// retry is in [1x, 2x] OverloadRetry, and nothing follows it.
		if c.hub == "A" && len(c.frames) == 1 && c.frames[0].kind == 'r' && c.frames[0].data != "1000" {
			c.overloaded = true
			c.end = "overload answer"
			e.stats.overloaded.Add(1)
		}
	}()
	base := e.urlA
	if c.hub == "B" {
		base = e.urlB
	}
	q := url.Values{}
	for _, t := range c.topics {
		q.Add("topic", t)
	}
	if c.sent != "" && c.via == "query" {
		q.Set("lastEventId", c.sent)
	}
	u := base + "/events"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		e.t.Errorf("conn %d: %v", c.id, err)
		return false
	}
	if c.sent != "" && c.via == "header" {
		req.Header.Set("Last-Event-ID", c.sent)
	}
	resp, err := e.httpc.Do(req)
	if err != nil {
		// The server closed the connection before any response: a stream
		// killed during its handshake (over its buffer cap, or by a
		// hub-level disconnect) has its write deadline set to now, so not
		// even the headers go out. An EventSource sees a network error and
		// reconnects; so does this client.
		c.end = "dropped before the response: " + err.Error()
		e.stats.dropped.Add(1)
		return false
	}
	c.status = resp.StatusCode
	if resp.StatusCode == http.StatusForbidden && c.hub == "A" && e.deniedScope(c.topics) {
		resp.Body.Close()
		c.end = "refused by Authorize"
		e.stats.forbidden.Add(1)
		return false
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		c.end = "status " + resp.Status
		e.stats.badStatus.Add(1)
		e.t.Errorf("conn %d: GET %s: %s", c.id, u, resp.Status)
		return false
	}

	frames := make(chan frame, 4)
	parsed := make(chan error, 1)
	go func() {
		parsed <- parseFrames(resp.Body, frames)
		close(frames)
	}()
	closeConn := func(why string) {
		c.end = why
		cancel()
		resp.Body.Close()
		for f := range frames { // frames already on the wire still count
			c.add(f)
		}
	}

	var lifeC <-chan time.Time
	if life > 0 {
		lt := time.NewTimer(life)
		defer lt.Stop()
		lifeC = lt.C
	}
	finish := e.finish
	got := 0
	for {
		if pauseAfter > 0 && got >= pauseAfter && finish != nil {
			// A slow consumer: stop reading for a while.
			pauseAfter = 0
			pt := time.NewTimer(pause)
			select {
			case <-pt.C:
			case <-finish:
				pt.Stop()
			}
		}
		select {
		case f, ok := <-frames:
			if !ok {
				c.end = fmt.Sprintf("server ended the stream (%v)", <-parsed)
				if c.behaviour == "slow" {
					c.end = "server ended the stream of a slow reader"
				}
				return reached
			}
			got++
			c.add(f)
			if fence := e.fence.Load(); fence > 0 && len(c.frames) > 0 && c.frames[len(c.frames)-1].passes(fence) {
				reached = true
				closeConn("reached the fence")
				return reached
			}
			if closeAfter > 0 && got >= closeAfter {
				closeConn(fmt.Sprintf("client closed after %d frames", got))
				return reached
			}
		case <-lifeC:
			closeConn("client closed after its lifetime")
			return reached
		case <-finish:
			// Finishing: read on, without dropping, until the fence.
			finish, lifeC, closeAfter, pauseAfter = nil, nil, 0, 0
			if c.reached(e.fence.Load()) {
				closeConn("reached the fence")
				return true
			}
		case <-e.finishDeadline:
			closeConn("gave up waiting for the fence")
			return reached
		}
	}
}

// add records a frame.
func (c *chaosConn) add(f frame) {
	switch {
	case f.Event == "heartbeat" && !f.HasID:
		c.heartbeats++
	case f.Event == "hello" && f.HasID:
		if f.Retry != "" { // sent in the hello's block
			c.frames = append(c.frames, chaosFrame{kind: 'r', data: f.Retry})
		}
		seq, _ := strconv.ParseInt(f.ID, 10, 64)
		c.frames = append(c.frames, chaosFrame{kind: 'h', seq: seq, data: f.ID + " " + f.Data})
	case f.Retry != "" && !f.HasID && f.Event == "" && f.Data == "":
		c.frames = append(c.frames, chaosFrame{kind: 'r', data: f.Retry}) // the overload answer
	case f.Event == "gap" && !f.HasID:
		c.frames = append(c.frames, chaosFrame{kind: 'g', data: f.Data})
	case f.HasID && f.Event != "":
		seq, err := strconv.ParseInt(f.ID, 10, 64)
		if err != nil {
			c.frames = append(c.frames, chaosFrame{kind: '?', data: fmt.Sprintf("%+v", f)})
			return
		}
		c.frames = append(c.frames, chaosFrame{kind: 'e', seq: seq, hash: chaosHash(f.Event, f.Data)})
	default:
		c.frames = append(c.frames, chaosFrame{kind: '?', data: fmt.Sprintf("%+v", f)})
	}
}

// reached reports whether the connection has accounted for every event up
// to the fence: received an id at or above it, or a gap reaching it (with
// a replay limit of 0, a client that connects after the fence never
// receives it).
func (c *chaosConn) reached(fence int64) bool {
	return slices.ContainsFunc(c.frames, func(f chaosFrame) bool { return f.passes(fence) })
}

func (f chaosFrame) passes(fence int64) bool {
	switch f.kind {
	case 'e', 'h':
		return f.seq >= fence
	case 'g':
		var g gapJSON
		return json.Unmarshal([]byte(f.data), &g) == nil && g.MissedThrough != nil && *g.MissedThrough >= fence
	}
	return false
}

// ---- the checker ----

// chaosView is the ledger frozen for checking.
type chaosView struct {
	bySeq map[int64]chaosEntry
	polls map[int64]uint64 // chaosLedger.polled
	seqs  []int64          // ascending
	inDB  map[int64]bool
	mark  int64 // the highest prune watermark of any topic
}

func chaosVisible(scope []string, topic string) bool {
	return len(scope) == 0 || topic == "" || slices.Contains(scope, topic)
}

// deniedScope reports whether hub A's Authorize refuses topics: the global
// scope when it is denied, else any denied topic among them.
func (e *chaosEnv) deniedScope(topics []string) bool {
	if len(topics) == 0 {
		return e.denied[""]
	}
	return slices.ContainsFunc(topics, func(t string) bool { return e.denied[t] })
}

// chaosScope draws a connection's scope: global a third of the time, else
// 1 to 4 distinct topics in random order.
func chaosScope(rng *rand.Rand) []string {
	if rng.IntN(3) == 0 {
		return nil
	}
	var scope []string
	for _, i := range rng.Perm(len(chaosTopics))[:1+rng.IntN(4)] {
		scope = append(scope, chaosTopics[i])
	}
	return scope
}

// visibleIn returns the ledger sequences visible to scope in (after, before).
func (v *chaosView) visibleIn(scope []string, after, before int64) []int64 {
	i, _ := slices.BinarySearch(v.seqs, after+1)
	var out []int64
	for ; i < len(v.seqs) && v.seqs[i] < before; i++ {
		if chaosVisible(scope, v.bySeq[v.seqs[i]].topic) {
			out = append(out, v.seqs[i])
		}
	}
	return out
}

// check verifies the database against the ledger, every connection
// against SPEC §1 and §4, and the in-process subscribers.
func (e *chaosEnv) check(results []chaosClientResult, subA, subB *chaosSub, elapsed time.Duration) {
	t := e.t
	v := &chaosView{bySeq: e.ledger.bySeq, polls: e.ledger.polled, inDB: map[int64]bool{}}
	for s := range v.bySeq {
		v.seqs = append(v.seqs, s)
	}
	slices.Sort(v.seqs)
	fence := e.fence.Load()

	// The database: every row is a ledger event, intact; every ledger
	// event missing from it was pruned; the head is the newest sequence.
	rows := crashReadRows(t, e.db)
	for _, ev := range rows {
		en, ok := v.bySeq[ev.Sequence]
		switch {
		case !ok:
			t.Errorf("row %d (%s) is in the log but no Publish returned it", ev.Sequence, ev.EventID)
		case en != chaosEntry{topic: ev.Topic, typ: ev.Type, eventID: ev.EventID, hash: chaosHash(ev.Type, string(ev.Payload))}:
			t.Errorf("row %d differs from what Publish returned", ev.Sequence)
		}
		v.inDB[ev.Sequence] = true
	}
	if err := e.db.QueryRow(qWatermarkGlobal).Scan(&v.mark); err != nil {
		t.Fatal(err)
	}
	for _, s := range v.seqs {
		if !v.inDB[s] && s > v.mark {
			t.Errorf("event %d is neither in the log nor below the prune watermark %d", s, v.mark)
		}
	}
	for s := range e.ledger.renewed {
		if v.inDB[s] {
			t.Errorf("a retry of event %d's id stored a new row although %d is still in the log", s, s)
		}
	}
	head, err := e.hubA.LatestSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if head != v.seqs[len(v.seqs)-1] || head != fence {
		t.Errorf("head %d, newest published %d, fence %d", head, v.seqs[len(v.seqs)-1], fence)
	}

	// In-process subscribers: strictly increasing; every event above
	// their start that is still in the log (so was never pruned, so was
	// readable when the hub caught up) delivered.
	for name, s := range map[string]*chaosSub{"A": subA, "B": subB} {
		s.mu.Lock()
		got := s.seqs
		s.mu.Unlock()
		delivered := map[int64]bool{}
		for i, seq := range got {
			if i > 0 && seq <= got[i-1] {
				t.Errorf("hub %s subscriber: %d after %d", name, seq, got[i-1])
			}
			delivered[seq] = true
		}
		for _, seq := range v.visibleIn(nil, s.start, fence+1) {
			if v.inDB[seq] && !delivered[seq] {
				t.Errorf("hub %s subscriber (from %d) never got event %d, which was never pruned", name, s.start, seq)
			}
		}
	}

	// Every connection.
	var conns, frames, events, replayed int
	gaps := map[string]int{}
	modes := map[string]int{}
	ends := map[string]int{}
	var violations []string
	for ci, r := range results {
		if !r.reachedFence {
			msg := fmt.Sprintf("client %d never reached the fence %d", ci, fence)
			if n := len(r.conns); n > 0 {
				msg += "; its last connection:\n" + e.trace(v, r.conns[n-1], errors.New("stuck"))
			}
			t.Errorf("%s", msg)
		}
		for _, c := range r.conns {
			if c.status != http.StatusOK {
				continue
			}
			if c.overloaded {
				if _, err := e.checkConn(v, c, head); err != nil {
					violations = append(violations, e.trace(v, c, err))
				}
				continue
			}
			conns++
			modes[c.mode]++
			ends[strings.TrimRight(strings.SplitN(strings.SplitN(c.end, " (", 2)[0], " frames", 2)[0], " 0123456789")]++
			frames += len(c.frames) + c.heartbeats
			st, err := e.checkConn(v, c, head)
			events += st.events
			replayed += st.replayed
			if st.gap != "" {
				gaps[st.gap]++
			}
			if err != nil {
				violations = append(violations, e.trace(v, c, err))
			}
		}
	}
	violations = append(violations, e.checkPolls(v, head)...)
	for i, msg := range violations {
		if i == 8 {
			t.Errorf("... and %d more violations", len(violations)-i)
			break
		}
		t.Errorf("%s", msg)
	}

	t.Logf("chaos phase and finish: %v", elapsed.Round(time.Millisecond))
	t.Logf("published %d events (%d publish calls, %d through hub B; %d retries with a used event id: %d returned the original, %d a new row after the original was pruned); %d still in the log; prune watermark %d",
		len(v.seqs), e.stats.publishes.Load(), e.stats.publishB.Load(), e.stats.retries.Load(),
		e.stats.retriesSame.Load(), e.stats.retriesNew.Load(), len(rows), v.mark)
	t.Logf("%d prune calls deleted %d rows; hub B restarted %d times; hub A disconnected all streams %d times",
		e.stats.pruneCalls.Load(), e.stats.pruned.Load(), e.stats.restarts.Load(), e.stats.resyncs.Load())
	t.Logf("checked %d connections (%d frames, %d events of which %d replayed): modes %v; gaps %v; ends %v; %d more dropped before any response",
		conns, frames, events, replayed, modes, gaps, ends, e.stats.dropped.Load())
	t.Logf("hub A refused %d requests by Authorize and %d by MaxConnections; %d connections retried after the overload answer were served",
		e.stats.forbidden.Load(), e.stats.overloaded.Load(), e.stats.servedAfterOverload.Load())
	if len(violations) > 0 {
		t.Errorf("%d connections violated the guarantee; seed %d", len(violations), e.seed)
	}
}

type chaosConnStats struct {
	events, replayed int
	gap              string
}

// checkConn checks one connection's frames:
//
//   - retry (hub A), then hello, whose id is its cursor and whose cursor
//     follows from what was sent; then at most one gap, at once, of the
//     reason the cursor calls for, with all its keys and a sane range;
//   - then only events and heartbeats; event ids strictly increasing from
//     the hello's cursor; every event a ledger event visible to the scope,
//     with the published type and data;
//   - between the cursor and each event, every ledger event visible to the
//     scope was delivered or lies in the gap's range: no silent hole;
//   - the replay (ids up to the hello's head) is at most the replay
//     limit, all of it when a replay_limit gap was sent, and newer than
//     the gap's range.
func (e *chaosEnv) checkConn(v *chaosView, c *chaosConn, finalHead int64) (st chaosConnStats, err error) {
	fs := c.frames
	limit := e.limitA
	if c.hub == "B" {
		limit = e.limitB
	}
	if c.hub == "A" && e.deniedScope(c.topics) && !c.overloaded {
		// The cap is checked before Authorize: a denied scope may get the
		// overload answer, never a stream.
		return st, fmt.Errorf("served a scope Authorize denies")
	}
	if c.overloaded {
		ms, err := strconv.ParseInt(fs[0].data, 10, 64)
		if lo := e.overloadRetry.Milliseconds(); err != nil || ms < lo || ms > 2*lo {
			return st, fmt.Errorf("overload answer retry %q outside [%d, %d] ms", fs[0].data, lo, 2*lo)
		}
		return st, nil
	}
	if c.hub == "A" && len(fs) > 0 {
		if fs[0].kind != 'r' || fs[0].data != "1000" {
			return st, fmt.Errorf("first frame is not retry: 1000")
		}
		fs = fs[1:]
	}
	if len(fs) == 0 {
		return st, nil // ended before the hello
	}
	if fs[0].kind != 'h' {
		return st, fmt.Errorf("first frame is not hello: %q", fs[0].data)
	}
	var hello struct {
		Topic  *string   `json:"topic"`
		Topics *[]string `json:"topics"`
		Cursor *int64    `json:"cursor"`
		Head   *int64    `json:"head"`
	}
	_, data, _ := strings.Cut(fs[0].data, " ")
	if err := json.Unmarshal([]byte(data), &hello); err != nil || hello.Cursor == nil || hello.Head == nil {
		return st, fmt.Errorf("hello data %q: %v", data, err)
	}
	cursor, head := *hello.Cursor, *hello.Head
	switch {
	case fs[0].seq != cursor:
		return st, fmt.Errorf("hello id %d differs from its cursor %d", fs[0].seq, cursor)
	case (hello.Topic == nil) != (len(c.topics) != 1) || (hello.Topic != nil && *hello.Topic != c.topics[0]):
		return st, fmt.Errorf("hello topic %v, connection topics %q", hello.Topic, c.topics)
	case hello.Topics == nil || len(*hello.Topics) != len(c.topics) || (len(c.topics) > 0 && !slices.Equal(*hello.Topics, c.topics)):
		return st, fmt.Errorf("hello topics %v, connection topics %q", hello.Topics, c.topics)
	case head < 0 || head > finalHead:
		// The head need not be a stored event: a rejected duplicate may
		// consume a sequence (SPEC §2).
		return st, fmt.Errorf("hello head %d is outside 0..%d", head, finalHead)
	}
	fs = fs[1:]

	// What the cursor calls for.
	sent, valid := int64(0), false
	if c.sent != "" {
		sent, valid = parseCursor(c.sent)
	}
	var g *gapJSON
	if len(fs) > 0 && fs[0].kind == 'g' {
		g = new(gapJSON)
		if err := chaosParseGap(fs[0].data, g); err != nil {
			return st, err
		}
		st.gap = g.Reason
		fs = fs[1:]
		if g.ReplayLimit != limit {
			return st, fmt.Errorf("gap replayLimit %d, want %d", g.ReplayLimit, limit)
		}
	}
	reason := ""
	if g != nil {
		reason = g.Reason
	}
	var covered [2]int64 // the gap's range, inclusive; empty when from > through
	covered[0] = 1
	switch {
	case c.sent == "":
		if g != nil || cursor != head {
			return st, fmt.Errorf("fresh connection: cursor %d, head %d, gap %q", cursor, head, reason)
		}
	case !valid:
		if reason != reasonInvalidCursor || g.ResumedFrom != nil || g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil || cursor != head {
			return st, fmt.Errorf("invalid cursor %q: cursor %d, head %d, gap %+v", c.sent, cursor, head, g)
		}
	case sent > head:
		if reason != reasonUnknownCursor || g.ResumedFrom == nil || *g.ResumedFrom != sent || g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil || cursor != head {
			return st, fmt.Errorf("cursor %d above head %d: cursor %d, gap %+v", sent, head, cursor, g)
		}
	default:
		if cursor != sent {
			return st, fmt.Errorf("resumed from %d but hello cursor is %d", sent, cursor)
		}
		switch reason {
		case "":
		case reasonReplayLimit:
			if g.ResumedFrom == nil || *g.ResumedFrom != sent || g.MissedFrom == nil || g.MissedThrough == nil || g.Missed == nil {
				return st, fmt.Errorf("replay_limit gap lacks a field: %+v", g)
			}
			from, through, missed := *g.MissedFrom, *g.MissedThrough, *g.Missed
			n := int64(len(v.visibleIn(c.topics, from-1, through+1)))
			if from <= sent || through < from || through > head || missed < 1 || missed > n ||
				!chaosVisible(c.topics, v.bySeq[from].topic) || !chaosVisible(c.topics, v.bySeq[through].topic) {
				return st, fmt.Errorf("replay_limit gap %d..%d missed %d (ledger: %d visible in range) after cursor %d, head %d",
					from, through, missed, n, sent, head)
			}
			covered = [2]int64{from, through}
		case reasonPruned:
			if g.ResumedFrom == nil || *g.ResumedFrom != sent || g.MissedFrom == nil || *g.MissedFrom != sent+1 ||
				g.MissedThrough == nil || *g.MissedThrough < sent+1 || *g.MissedThrough > head || g.Missed != nil {
				return st, fmt.Errorf("pruned gap %s after cursor %d, head %d", chaosGapString(g), sent, head)
			}
			// Honest: some event of the scope in the range was pruned.
			if !slices.ContainsFunc(v.visibleIn(c.topics, sent, *g.MissedThrough+1), func(s int64) bool { return !v.inDB[s] }) {
				return st, fmt.Errorf("pruned gap %s, but every event of the scope in its range is still in the log", chaosGapString(g))
			}
			covered = [2]int64{*g.MissedFrom, *g.MissedThrough}
		default:
			return st, fmt.Errorf("gap reason %q for valid cursor %d ≤ head %d", reason, sent, head)
		}
	}

	prev := cursor
	for i, f := range fs {
		switch f.kind {
		case 'e':
		case 'g':
			return st, fmt.Errorf("gap frame at position %d, after events", i)
		default:
			return st, fmt.Errorf("unexpected frame %q", f.data)
		}
		seq := f.seq
		if seq <= prev {
			return st, fmt.Errorf("event %d after %d: ids not strictly increasing", seq, prev)
		}
		en, ok := v.bySeq[seq]
		switch {
		case !ok:
			return st, fmt.Errorf("event %d was never published", seq)
		case !chaosVisible(c.topics, en.topic):
			return st, fmt.Errorf("event %d of topic %q delivered to scope %q", seq, en.topic, c.topics)
		case en.hash != f.hash:
			return st, fmt.Errorf("event %d: type or data differ from what was published", seq)
		}
		if g != nil && covered[0] <= covered[1] && seq <= covered[1] {
			return st, fmt.Errorf("event %d inside or below the gap's range %d..%d", seq, covered[0], covered[1])
		}
		for _, s := range v.visibleIn(c.topics, prev, seq) {
			if s < covered[0] || s > covered[1] {
				return st, &chaosHole{seq: s, prev: prev, next: seq}
			}
		}
		if seq <= head {
			st.replayed++
		}
		st.events++
		prev = seq
	}
	if st.replayed > limit {
		return st, fmt.Errorf("%d events replayed, limit %d", st.replayed, limit)
	}
	if reason == reasonReplayLimit && prev > head && st.replayed != limit {
		return st, fmt.Errorf("replay_limit gap but %d events replayed, limit %d", st.replayed, limit)
	}
	return st, nil
}

// chaosHole is the violation §1 forbids: an event visible to the scope,
// above the cursor, neither delivered nor named in a gap.
type chaosHole struct{ seq, prev, next int64 }

func (h *chaosHole) Error() string {
	return fmt.Sprintf("silent hole: event %d is visible, between delivered %d and %d, and in no gap", h.seq, h.prev, h.next)
}

func chaosParseGap(data string, g *gapJSON) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &keys); err != nil {
		return fmt.Errorf("gap data %q: %v", data, err)
	}
	for _, k := range []string{"reason", "resumedFrom", "missedFrom", "missedThrough", "missed", "replayLimit"} {
		if _, ok := keys[k]; !ok {
			return fmt.Errorf("gap %s lacks key %q", data, k)
		}
	}
	if len(keys) != 6 {
		return fmt.Errorf("gap %s has %d keys, want 6", data, len(keys))
	}
	return json.Unmarshal([]byte(data), g)
}

func chaosGapString(g *gapJSON) string {
	b, _ := json.Marshal(g)
	return string(b)
}

// trace describes a violating connection: what it was, the frames around
// the violation, and what else happened meanwhile.
func (e *chaosEnv) trace(v *chaosView, c *chaosConn, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION (seed %d) conn %d of client %d: hub %s, topics %q, mode %s, cursor %q via %s, %s; %v..%v, ended: %s\n  %v\n",
		e.seed, c.id, c.client, c.hub, c.topics, c.mode, c.sent, c.via, c.behaviour, c.start.Round(time.Millisecond),
		c.stop.Round(time.Millisecond), c.end, err)
	focus := int64(-1)
	var hole *chaosHole
	if errors.As(err, &hole) {
		focus = hole.next
		en := v.bySeq[hole.seq]
		fmt.Fprintf(&b, "  missing event %d: topic %q, type %q, id %s, still in the log at the end: %v\n",
			hole.seq, en.topic, en.typ, en.eventID, v.inDB[hole.seq])
	}
	// The handshake frames and the events around the focus.
	idx := -1
	for i, f := range c.frames {
		if f.kind == 'e' && f.seq == focus {
			idx = i
		}
	}
	for i, f := range c.frames {
		near := idx >= 0 && i >= idx-5 && i <= idx+2
		if f.kind != 'e' || near || (idx < 0 && i < 12) {
			if f.kind == 'e' {
				en := v.bySeq[f.seq]
				fmt.Fprintf(&b, "  frame %d: event %d (topic %q)\n", i, f.seq, en.topic)
			} else {
				fmt.Fprintf(&b, "  frame %d: %c %s\n", i, f.kind, f.data)
			}
		}
	}
	fmt.Fprintf(&b, "  %d frames in all\n", len(c.frames))
	e.timeline.mu.Lock()
	for _, m := range e.timeline.entries {
		if m.at >= c.start-200*time.Millisecond && m.at <= c.stop {
			fmt.Fprintf(&b, "  at %v: %s\n", m.at.Round(time.Millisecond), m.what)
		}
	}
	e.timeline.mu.Unlock()
	return b.String()
}

// TestChaosCatchUpPastMissingSequence pins a hang the chaos suite's reading
// of live.go found. A publish's delivery catches up on rows other processes
// committed below its batch: deliver(after, rows) calls catchUp(after, 1000)
// until the live position reaches after. If the sequence after itself holds
// no row (a duplicate event id consumed it, or it was pruned) and 1,000 or
// more rows sit above it when catchUp reads, every page is trimmed to
// nothing and the page is full, so neither the position nor the loop moves:
// the writer goroutine spins forever holding the live lock, and every later
// Publish on the hub, every live delivery and Close hang.
//
// The scenario is deterministic: hub A lags behind hub B (another process's
// writes, no tail); B's retried event id consumes the sequence just below
// A's next row; while A's delivery waits for the live lock (held here by the
// test, as a tail catching up or a Subscribe callback would), B commits
// 1,000 more rows. One process alone hangs the same way when a retried id
// is followed by a group commit of 1,000 or more publishes.
func TestChaosCatchUpPastMissingSequence(t *testing.T) {
	ctx := context.Background()
	db, path := openTestDB(t)
	hubA := newTestHub(t, db, Options{})
	dbB, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dbB.Close() })
	hubB := newTestHub(t, dbB, Options{})
	// A live subscriber: a hub with none skips catching up altogether.
	defer hubA.Subscribe(func(Event) {})()

	first := mustPublish(t, hubA, "", "a1") // A's live position: 1
	mustPublish(t, hubB, "", "b1", WithEventID("retried"))
	if ev := mustPublish(t, hubB, "", "b1 again", WithEventID("retried")); ev.Sequence != first.Sequence+1 {
		t.Fatalf("retry returned %d", ev.Sequence)
	}
	consumed, _ := hubB.LatestSequence(ctx) // the retry consumed this sequence; no row holds it
	if consumed != first.Sequence+2 {
		t.Fatalf("head %d after a retried id; expected the retry to consume %d", consumed, first.Sequence+2)
	}

	hubA.live.mu.Lock() // A's delivery of its next row waits here
	locked := true
	defer func() {
		if locked {
			hubA.live.mu.Unlock()
		}
	}()
	published := make(chan error, 1)
	go func() {
		_, err := hubA.Publish(ctx, "", "a2")
		published <- err
	}()
	// Wait for A's row to be committed (its delivery is then blocked).
	deadline := time.Now().Add(waitFor)
	for head, _ := hubA.LatestSequence(ctx); head != consumed+1; head, _ = hubA.LatestSequence(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("A's publish not committed: head %d", head)
		}
		runtime.Gosched()
	}
	// Another process commits 1,000 rows above it.
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := hubB.Publish(ctx, "", map[string]int{"w": w, "i": i}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	hubA.live.mu.Unlock()
	locked = false

	select {
	case err := <-published:
		if err != nil {
			t.Fatal(err)
		}
		return // delivered: no hang
	case <-time.After(5 * time.Second):
	}
	// Hung. Prune so fewer than a page of rows remain above A's position;
	// the loop then ends, and the hub can be closed.
	if _, err := hubB.Prune(ctx, RetentionPolicy{MaxEvents: 10}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-published:
		t.Errorf("BUG: a Publish on hub A hung for 5s in deliver's catch-up loop (live.go catchUp): sequence %d holds no row "+
			"(consumed by a retried event id) and 1,000 rows lie above it; it returned only after a prune left fewer than a page", consumed)
	case <-time.After(waitFor):
		t.Fatalf("BUG: a Publish on hub A hung in deliver's catch-up loop and did not recover after a prune")
	}
}

// TestChaosCloseUnderPublishers closes hubs while many goroutines publish
// to them. Every Publish must return promptly, with success (the event is
// stored) or ErrClosed (nothing is stored); none may hang on a request the
// closing writer never answered, and no goroutine may outlive Close.
func TestChaosCloseUnderPublishers(t *testing.T) {
	db, _ := openTestDB(t)
	ctx := context.Background()
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	var stored, refused int
	for round := range rounds {
		h, err := New(db, Options{})
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			id  string
			err error
		}
		results := make(chan result, 1<<16)
		started := make(chan struct{}, 1<<16)
		var wg sync.WaitGroup
		for w := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					id := fmt.Sprintf("close-r%d-w%d-%d", round, w, i)
					pctx, cancel := context.WithTimeout(ctx, waitFor)
					_, err := h.Publish(pctx, "", map[string]int{"i": i}, WithEventID(id))
					cancel()
					results <- result{id, err}
					started <- struct{}{}
					if err != nil {
						return
					}
				}
			}()
		}
		for range 64 { // close while the writer is busy
			<-started
		}
		h.Close()
		wg.Wait()
		close(results)
		for r := range results {
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM events WHERE event_id = ?`, r.id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			switch {
			case r.err == nil && n == 1:
				stored++
			case errors.Is(r.err, ErrClosed) && n == 0:
				refused++
			case errors.Is(r.err, context.DeadlineExceeded):
				t.Fatalf("round %d: Publish of %s hung for %v across Close (stored: %v)", round, r.id, waitFor, n == 1)
			default:
				t.Fatalf("round %d: Publish of %s returned %v, and %d rows hold it", round, r.id, r.err, n)
			}
		}
	}
	t.Logf("%d rounds: %d publishes stored, %d refused with ErrClosed, none hung", rounds, stored, refused)
}
