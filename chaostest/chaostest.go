// Package chaostest checks replayd's guarantee ("contiguity or an explicit gap, never
// a silent hole") under disorder, against any store: a backend's test hands
// Run a factory of hubs on one shared log, and the same chaos run and
// oracle check SQLite and PostgreSQL alike. A backend's test runs
//
//	func TestChaos(t *testing.T) {
//		chaostest.Run(t, func(t *testing.T) chaostest.Open {
//			log := newEmptyLog(t) // a fresh, empty log
//			return func(opts replayd.Options) (*replayd.EventHub, func(), error) {
//				s, err := open(log) // each call: its own store or pool
//				if err != nil {
//					return nil, nil, err
//				}
//				h, err := replayd.NewWithStore(s, opts)
//				if err != nil {
//					s.Close()
//					return nil, nil, err
//				}
//				return h, func() { h.Close(); s.Close() }, nil
//			}
//		}, chaostest.Config{})
//	}
//
// next to storetest.Run, the deterministic contract tests of the store
// alone.
//
// The run: hub A (the main writer, with an Authorize that denies a random
// set of scopes and a small MaxConnections) and hub B (another hub on the
// same log, as another process or node, tailing, restarted now and then)
// serve SSE and poll clients over real HTTP on listeners with small send
// buffers, each hub serving its streams detached (DetachConnections) or
// through net/http as the seed decides. A storm phase opens storms of handshakes from cursor 0 while a
// large log is published, and six events of 1 MiB follow (polls over them
// are cut at 4 MiB of payload); then, for Config.Duration, publishers (topics,
// broadcasts, multi-line payloads, retried event ids, some through hub B),
// two pruners, restarts of hub B, server-side kills of hub A's connections,
// 28 SSE clients (fresh, resumed, stale, future and invalid cursors, by
// header or query; dropping, or stalling until MaxBufferedBytes cuts them
// off), 8 poll clients and 3 Go clients (package client: SSE, long polls
// and auto, each Run stopped now and then and continued from its Cursor)
// run at once, some of the SSE and poll requests' access revoked
// (replayd.WithRevocation) before they are sent or while they are set up
// and served. A fence event ends it: every client
// must reach it. Then the oracle checks every frame of every connection and
// every poll answer against a ledger of what Publish returned, cross-checked
// with the log: handshake shape, a head no older than what was committed
// before the request, strictly increasing real ids with exact
// type, topic and data, every visible event above the cursor delivered or
// inside the gap's range, honest pruned gaps, replay within the limit, no
// denied scope served, nothing served to a request revoked before it was
// sent, overload answers in range; and each hub's in-process
// subscriber saw every unpruned event in order.
//
// Every random choice comes from Config.Seed, so a failing seed replays the
// same decisions (the interleaving is the scheduler's). The seed is logged;
// a failure prints it, with a trace of the violating connection.
//
// The oracle is also an API of its own, for tests that drive hubs some
// other way — in other OS processes, say, as replaydpg's
// TestNodesInProcesses does — and record what happened: a Ledger of what
// each Publish returned (Published), of publishes whose outcome is unknown
// because their publisher died (Attempted), and of rows read from the log
// along the way (Logged); a Server for each hub that served (its replay
// limit, retry, admission policy); a Conn for each SSE connection, every
// frame Added to it; a PollSession of Polls for each run of polls, every
// answer Recorded (a visit that resumes from an earlier one names it in
// After, and is held to the cursor that one ended at); and, at the end, the log and its prune watermark
// (ReadLog) and the head. Check returns every violation with its trace, and
// what it checked. Run records its own clients the same way and checks them
// with the same Check:
//
//	rows, mark, err := chaostest.ReadLog(ctx, hub)
//	...
//	rep := chaostest.Check(chaostest.Input{Ledger: ledger, Log: rows, Mark: mark, Head: head,
//		Conns: conns, Polls: sessions, Seed: seed, Timeline: timeline})
//	for _, v := range rep.Violations {
//		t.Error(v)
//	}
//
// Run opens several hubs on the log at once and tens of HTTP connections;
// it takes Config.Duration plus the storm phase and the finish (seconds).
package chaostest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// Open opens a hub with opts on the run's log, on a store (or connection
// pool) of its own, as another process or node would. It may add to opts
// (DetachConnections, say) but must keep what is set. close closes the
// hub and then whatever Open made for it; the run calls it exactly once
// per hub, when it restarts that hub or when the test ends. Open is called
// from several goroutines: it must not call t.Fatal, it returns an error.
type Open func(opts replayd.Options) (h *replayd.EventHub, close func(), err error)

// Config tunes a run. The zero value is a full run.
type Config struct {
	// Seed drives every random choice; 0 takes one from the clock. The
	// tests of replayd and replaydpg take it from -chaos.seed.
	Seed uint64
	// Duration is how long the chaos phase runs: 0 means 20 s, 2 s with
	// -short. The tests of replayd and replaydpg take it from
	// -chaos.duration.
	Duration time.Duration
	// TailMin and TailMax bound the interval each hub B polls the log at
	// (StartTail's interval, drawn per hub; its MaxInterval is five times
	// that): at times slower than an aggressive prune, so that rows a hub
	// has not read yet are deleted under it. 0 means 2 ms and 61 ms.
	TailMin, TailMax time.Duration
	// Disconnect, if set, ends every SSE stream the hub serves, from inside
	// the hub, as it does itself when it must resync its clients (replayd's
	// own test passes the unexported resync). The run calls it on hub A
	// now and then, and at other times closes every connection hub A's
	// listener accepted; nil: only the latter.
	Disconnect func(h *replayd.EventHub)
	// TopicRetention, if set, prunes per topic (replayd.RetentionPolicy's
	// Topics): topic t0 every second by a policy of its own (its newest 1
	// to 10 events, or those older than 0.2 to 1 s) or by PruneTopic (all
	// of it), t1 never (every prune carries an entry for it without a
	// limit), the other topics and broadcasts by the pruners' random
	// default. Scopes over t0, t1 and the rest then lose events in holes
	// between the events they keep: the oracle holds them to pruned gaps
	// that name where, and to every kept event delivered.
	TopicRetention bool
	// Transactions, if set, makes the publishers also publish inside
	// transactions on hub A's database (EventHub.InTx), rolling back one in
	// three: committed events are published ones, rolled-back ones must
	// never appear. The SQLite run sets it.
	Transactions bool
}

const (
	numPublishers = 4
	numClients    = 28
	finishTime    = 40 * time.Second // bound on reaching the fence after the chaos phase
	// publishTimeout bounds every Publish: one that hangs (on a hub
	// closed under it, say) fails the test instead of hanging it.
	publishTimeout = 30 * time.Second
	// waitFor bounds every other wait.
	waitFor = 10 * time.Second
)

var allTopics = []string{"t0", "t1", "t2", "t3", "t4"}

// env is one run's shared state.
type env struct {
	t    *testing.T
	cfg  Config
	seed uint64
	open Open

	hubA         *replayd.EventHub
	hubB         atomic.Pointer[replayd.EventHub] // replaced by restarts
	closeB       func()                           // closes the current hub B; the restarter's
	optsA, optsB replayd.Options
	srvA, srvB   *Server // what the oracle knows of hub A and of every hub B
	urlA, urlB   string
	connsA       *listener    // hub A's server's connections, for server-side kills
	httpc        *http.Client // SSE clients' and Go clients': a small read buffer
	pollc        *http.Client // poll clients'

	ledger   *Ledger
	timeline *Timeline

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
	polls   pollState
	stats   struct {
		publishes, retries, retriesSame, retriesNew, publishB atomic.Int64
		bigEvents                                             atomic.Int64
		pruneCalls, pruned, restarts, resyncs, kills          atomic.Int64
		badStatus, dropped                                    atomic.Int64
		forbidden, overloaded, servedAfterOverload            atomic.Int64
		revokedBefore, revokedWhileServed                     atomic.Int64
		txCommits, txRollbacks                                atomic.Int64
	}
}

// Run runs the chaos phase on the hubs newLog's Open makes, then checks
// the guarantee for every connection and poll. newLog is called once and must
// return an Open on a new, empty log; cleaning the log up is its business,
// with t.Cleanup.
func Run(t *testing.T, newLog func(t *testing.T) Open, cfg Config) {
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with Config.Seed %d; -chaos.seed=%d in replayd's and replaydpg's tests)", seed, seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: rerun with -run '^%s$' -chaos.seed=%d", seed, t.Name(), seed)
		}
	})
	duration := cfg.Duration
	if duration <= 0 {
		duration = 20 * time.Second
		if testing.Short() {
			duration = 2 * time.Second
		}
	}
	if cfg.TailMin <= 0 {
		cfg.TailMin = 2 * time.Millisecond
	}
	if cfg.TailMax <= 0 {
		cfg.TailMax = max(cfg.TailMin, 61*time.Millisecond)
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	e := &env{
		t: t, cfg: cfg, seed: seed,
		open:           newLog(t),
		stop:           make(chan struct{}),
		finish:         make(chan struct{}),
		finishDeadline: make(chan struct{}),
	}
	e.ledger = NewLedger()

	e.denied = map[string]bool{"": rng.IntN(4) == 0} // "": the global scope
	for _, i := range rng.Perm(len(allTopics))[:1+rng.IntN(2)] {
		e.denied[allTopics[i]] = true
	}
	e.overloadRetry = 50 * time.Millisecond
	e.optsA = replayd.Options{
		SSE: replayd.SSEOptions{
			ReplayLimit:       []int{10, 40, 100}[rng.IntN(3)],
			HeartbeatInterval: 250 * time.Millisecond,
			Retry:             time.Second,
			MaxBufferedBytes:  48 << 10, // slow readers get disconnected here
			// About 60% of 28 clients use hub A: a cap of 12 to 17 bites
			// now and then, and more while the clients wait for the fence.
			MaxConnections:    12 + rng.IntN(6),
			OverloadRetry:     e.overloadRetry,
			DetachConnections: rng.IntN(2) == 0,
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
	e.optsB = replayd.Options{SSE: replayd.SSEOptions{
		ReplayLimit:       []int{-1, 25, 300}[rng.IntN(3)],
		HeartbeatInterval: 100 * time.Millisecond,
		MaxBufferedBytes:  256 << 10,
		DetachConnections: rng.IntN(2) == 0,
	}}
	e.srvA = &Server{Name: "A", ReplayLimit: max(e.optsA.SSE.ReplayLimit, 0), Retry: e.optsA.SSE.Retry,
		Detached: e.optsA.SSE.DetachConnections, Denied: e.deniedScope, OverloadRetry: e.overloadRetry}
	e.srvB = &Server{Name: "B", ReplayLimit: max(e.optsB.SSE.ReplayLimit, 0), Retry: e.optsB.SSE.Retry,
		Detached: e.optsB.SSE.DetachConnections, Unavailable: true} // closing under a restart
	t.Logf("duration %v; hub A replay limit %d, max connections %d, denied scopes %v, detached %v; hub B replay limit %d, detached %v, tail every %v to %v",
		duration, e.srvA.ReplayLimit, e.optsA.SSE.MaxConnections, e.denied, e.optsA.SSE.DetachConnections,
		e.srvB.ReplayLimit, e.optsB.SSE.DetachConnections, cfg.TailMin, cfg.TailMax)

	hubA, closeA, err := e.open(e.optsA)
	if err != nil {
		t.Fatalf("open hub A: %v", err)
	}
	t.Cleanup(closeA)
	e.hubA = hubA
	subA, err := Subscribe("A", hubA)
	if err != nil {
		t.Fatal(err)
	}
	firstB, closeB, subB, err := e.newHubB(rng)
	if err != nil {
		t.Fatal(err)
	}
	e.hubB.Store(firstB)
	e.closeB = closeB

	muxA := http.NewServeMux()
	muxA.Handle("/events", e.hubA.Handler())
	muxA.Handle("/poll", e.hubA.PollHandler())
	e.urlA, e.connsA = serve(t, revocable(muxA))
	e.urlB, _ = serve(t, revocable(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/poll" {
			e.hubB.Load().PollHandler().ServeHTTP(w, r)
			return
		}
		e.hubB.Load().Handler().ServeHTTP(w, r)
	})))
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
	// Poll clients read each answer whole, so they have no use for the
	// small read buffer, and an answer of several MiB (large events kept
	// by a topic retention never prunes) would crawl through it on
	// loopback: a 16 KiB window below the segment size leaves each
	// segment to the peer's delayed ACK, about 400 KB/s, and a 4 MiB
	// answer outlasts the poll's timeout every time it is retried.
	pollTransport := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(pollTransport.CloseIdleConnections)
	e.pollc = &http.Client{Transport: pollTransport}

	e.timeline = NewTimeline()
	// The storm phase: storms of handshakes from cursor 0 while a large log
	// is being published (nothing is pruned yet, so every storm has the
	// whole log above its cursor to count and replay).
	prefill := 5_000
	if testing.Short() {
		prefill = 1_500
	}
	stormStop := make(chan struct{})
	stormed := make(chan []*Conn, 1)
	go func() { stormed <- e.stormer(rand.New(rand.NewPCG(seed, 400)), stormStop) }()
	e.prefill(prefill)
	close(stormStop)
	storms := <-stormed
	t.Logf("storm phase: %d events published while %d connections stormed in from cursor 0, in %v",
		prefill, len(storms), e.timeline.Since().Round(time.Millisecond))

	e.bigBurst(rand.New(rand.NewPCG(seed, 150)))

	var wg sync.WaitGroup // publishers, pruners, restarter
	for p := range numPublishers {
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
	if e.cfg.TopicRetention {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.topicPruner(rand.New(rand.NewPCG(seed, 250)))
		}()
	}
	wg.Add(1)
	var lastSubB *Subscriber
	go func() {
		defer wg.Done()
		lastSubB = e.restarter(rand.New(rand.NewPCG(seed, 300)), subB)
	}()
	var cwg sync.WaitGroup
	results := make([]clientResult, numClients)
	for c := range numClients {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			results[c] = e.client(c, rand.New(rand.NewPCG(seed, uint64(1000+c))))
		}()
	}
	e.startPollClients(seed, &cwg)
	goRuns := make([][]*ClientRun, numGoClients)
	goReached := make([]bool, numGoClients)
	for c := range numGoClients {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			goRuns[c], goReached[c] = e.goClient(c, rand.New(rand.NewPCG(seed, uint64(3000+c))))
		}()
	}

	phase := time.NewTimer(duration)
	<-phase.C
	close(e.stop)
	wg.Wait()
	// Every publisher has returned: publish the fence, a broadcast every
	// client must reach, and let the clients finish.
	fence := e.publish(e.hubA, "", map[string]string{"fence": "end"}, replayd.WithType("fence"))
	e.fence.Store(fence.Sequence)
	close(e.finish)
	finishTimer := time.AfterFunc(finishTime, func() { close(e.finishDeadline) })
	cwg.Wait()
	if !finishTimer.Stop() {
		t.Errorf("clients did not all reach the fence within %v", finishTime)
	}
	waitSub(t, lastSubB, fence.Sequence)
	waitSub(t, subA, fence.Sequence)
	phaseEnd := e.timeline.Since()
	// The storms' connections are checked like any other; they need not
	// reach the fence.
	results = append(results, clientResult{conns: storms, reachedFence: true})

	for c, reached := range goReached {
		if !reached {
			t.Errorf("go client %d never reached the fence %d", c, fence.Sequence)
		}
	}
	e.check(results, slices.Concat(goRuns...), subA, lastSubB, phaseEnd)
}

// newHubB opens another hub on the log, tailing. Its subscriber records its
// live deliveries. closeHub is registered with t.Cleanup too, and runs once.
func (e *env) newHubB(rng *rand.Rand) (h *replayd.EventHub, closeHub func(), sub *Subscriber, err error) {
	h, c, err := e.open(e.optsB)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("open hub B: %w", err)
	}
	closeHub = sync.OnceFunc(c)
	e.t.Cleanup(closeHub)
	if sub, err = Subscribe("B", h); err != nil {
		return nil, nil, nil, err
	}
	// Slow enough at times that an aggressive prune deletes rows it has not
	// read yet.
	interval := e.cfg.TailMin + time.Duration(rng.Int64N(int64(e.cfg.TailMax-e.cfg.TailMin)+1))
	if _, err := h.StartTail(interval, replayd.TailOptions{MaxInterval: 5 * interval}); err != nil {
		return nil, nil, nil, fmt.Errorf("hub B: start tail: %w", err)
	}
	return h, closeHub, sub, nil
}

// serve starts a real HTTP server whose accepted connections have a
// small send buffer, so a client that stops reading backs frames up into
// the hub's per-connection queue quickly.
func serve(t *testing.T, h http.Handler) (string, *listener) {
	srv := httptest.NewUnstartedServer(h)
	l := &listener{Listener: srv.Listener}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, l
}

// revocable puts a revocation context on each request whose query has a
// revoke parameter (replayd.WithRevocation), as an application's session
// middleware does, and revokes it as the parameter says: "before" the hub
// sees the request, or a delay after it arrived ("7ms"): while it is set
// up or served.
func revocable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		when := r.URL.Query().Get("revoke")
		if when == "" {
			next.ServeHTTP(w, r)
			return
		}
		revoked, revoke := context.WithCancel(context.Background())
		if d, err := time.ParseDuration(when); err == nil {
			time.AfterFunc(d, revoke)
		} else {
			revoke()
		}
		next.ServeHTTP(w, r.WithContext(replayd.WithRevocation(r.Context(), revoked)))
	})
}

// drawRevocation draws whether, and how, a request's access is revoked: a
// twentieth before it is sent, a tenth within 40 ms of its arrival (mostly
// while it is set up). rng is the client's own for this, so the rest of
// its choices are those of a run without revocations.
func drawRevocation(rng *rand.Rand) (how string, after time.Duration) {
	switch r := rng.IntN(20); {
	case r == 0:
		return RevokedBefore, 0
	case r < 3:
		return RevokedWhileServed, time.Duration(rng.IntN(40_000)) * time.Microsecond
	}
	return "", 0
}

// revokeParam is the revoke parameter for a request revoked as how says
// (revocable), "" for none.
func revokeParam(how string, after time.Duration) string {
	switch how {
	case RevokedBefore:
		return "before"
	case RevokedWhileServed:
		return after.String()
	}
	return ""
}

// listener keeps every connection it accepted, so that all can be closed
// under the server at once (a server-side kill): net/http forgets a
// connection once a handler hijacks it.
type listener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(16 << 10)
	}
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// closeAll closes every connection accepted so far; it returns how many it
// closed (some may have ended already).
func (l *listener) closeAll() int {
	l.mu.Lock()
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return len(conns)
}

// server returns the Server record of hub ("A" or "B").
func (e *env) server(hub string) *Server {
	if hub == "B" {
		return e.srvB
	}
	return e.srvA
}

// deniedScope reports whether hub A's Authorize refuses topics: the global
// scope when it is denied, else any denied topic among them.
func (e *env) deniedScope(topics []string) bool {
	if len(topics) == 0 {
		return e.denied[""]
	}
	return slices.ContainsFunc(topics, func(t string) bool { return e.denied[t] })
}

// check reads the log at the end and hands it, the ledger and every
// record to Check; it reports the violations and what was checked.
func (e *env) check(results []clientResult, goRuns []*ClientRun, subA, subB *Subscriber, elapsed time.Duration) {
	t := e.t
	fence := e.fence.Load()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The head before the hub below opens the log, which raises its
	// sequence floor.
	head, err := e.hubA.LatestSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, closeHub, err := e.open(replayd.Options{})
	if err != nil {
		t.Fatalf("open a hub to read the log: %v", err)
	}
	rows, mark, err := ReadLog(ctx, h)
	closeHub()
	if err != nil {
		t.Fatal(err)
	}
	if head != fence {
		t.Errorf("head %d, fence %d", head, fence)
	}
	in := Input{Ledger: e.ledger, Log: rows, Mark: mark, Head: head,
		Subscribers: []*Subscriber{subA, subB}, ClientRuns: goRuns, Seed: e.seed, Timeline: e.timeline}
	for ci, r := range results {
		if !r.reachedFence {
			msg := fmt.Sprintf("client %d never reached the fence %d", ci, fence)
			if n := len(r.conns); n > 0 {
				c := r.conns[n-1]
				msg += fmt.Sprintf("; its last connection: conn %d on hub %s, cursor %q, %d frames, ended: %s", c.ID, c.hub, c.Sent, len(c.frames), c.End)
			}
			t.Errorf("%s", msg)
		}
		in.Conns = append(in.Conns, r.conns...)
	}
	for c, ss := range e.polls.sessions {
		if !e.polls.reached[c] {
			msg := fmt.Sprintf("poll client %d never reached the fence %d", c, fence)
			if n := len(ss); n > 0 {
				s := ss[n-1]
				msg += fmt.Sprintf("; its last session: %s on hub %s, topics %v, %d polls, ended: %s", s.Mode, s.hub, s.Topics, len(s.Polls), s.End)
				for _, p := range s.Polls[max(0, len(s.Polls)-6):] {
					msg += fmt.Sprintf("; poll cursor %q limit %d wait %v took %v: status %d", p.Sent, p.Limit, p.Wait, p.Stop-p.Start, p.Status)
					if p.OK() {
						msg += fmt.Sprintf(", cursor %d head %d, %d events, gap %q", p.Cursor(), p.Head(), p.Events(), p.Gap())
					}
				}
			}
			t.Errorf("%s", msg)
		}
		in.Polls = append(in.Polls, ss...)
	}
	rep := Check(in)
	for i, msg := range rep.Violations {
		if i == 8 {
			t.Errorf("... and %d more violations", len(rep.Violations)-i)
			break
		}
		t.Errorf("%s", msg)
	}

	t.Logf("chaos phase and finish: %v", elapsed.Round(time.Millisecond))
	t.Logf("published %d events (%d publish calls, %d through hub B, %d of 1 MiB in bursts; %d retries with a used event id: %d returned the original, %d a new row after the original was pruned); %d still in the log; prune watermark %d",
		rep.Published, e.stats.publishes.Load(), e.stats.publishB.Load(), e.stats.bigEvents.Load(), e.stats.retries.Load(),
		e.stats.retriesSame.Load(), e.stats.retriesNew.Load(), len(rows), mark)
	t.Logf("%d prune calls deleted %d rows; hub B restarted %d times; hub A disconnected all streams %d times, its listener closed all connections %d times",
		e.stats.pruneCalls.Load(), e.stats.pruned.Load(), e.stats.restarts.Load(), e.stats.resyncs.Load(), e.stats.kills.Load())
	if e.cfg.Transactions {
		t.Logf("%d transactions committed events on hub A, %d rolled back", e.stats.txCommits.Load(), e.stats.txRollbacks.Load())
	}
	rep.Log(t)
	ps := &e.polls
	t.Logf("%d SSE connections dropped before any response; poll clients: %d sessions from an SSE client's id, %d polls (%d long); "+
		"refused: %d by Authorize, %d by MaxConnections on hub A, %d by hub B closing; %d dropped, %d invalid cursors refused",
		e.stats.dropped.Load(), ps.fromSSE.Load(), ps.polls.Load(), ps.longPolls.Load(),
		ps.forbidden.Load(), ps.overloaded.Load(), ps.closedB.Load(), ps.dropped.Load(), ps.badRequests.Load())
	t.Logf("hub A refused %d requests by Authorize and %d by MaxConnections; %d connections retried after the overload answer were served",
		e.stats.forbidden.Load(), e.stats.overloaded.Load(), e.stats.servedAfterOverload.Load())
	t.Logf("revoked: %d SSE connections before they were sent, %d while served; %d polls before they were sent, %d while served, %d of all these polls refused 403",
		e.stats.revokedBefore.Load(), e.stats.revokedWhileServed.Load(), ps.revokedBefore.Load(), ps.revokedWhileServed.Load(), ps.revokedRefused.Load())
	if len(rep.Violations) > 0 {
		t.Errorf("%d violations of the guarantee; seed %d", len(rep.Violations), e.seed)
	}
}
