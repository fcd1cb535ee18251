package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The c100k-multi phase: more connections than one process may hold open
// (RLIMIT_NOFILE is per process), through several server processes
// sharing one SQLite file. Each server runs StartTail, so an event
// published in one reaches the streams of all; each listens on a port of
// its own (the kernel balances nothing: server j gets exactly its share)
// and is dialled by one client process of its own, whose connections come
// from loopback source addresses no other client uses, at most perSource
// connections each. Measured for all connections together: connect +
// hello, RSS (servers and clients apart), heartbeat CPU, and the delivery
// latency of broadcasts published in the first server. The raw ceiling
// (raw.go) runs the same way, with no log: a broadcast is published in
// every raw server at once, so it has no tail to wait for.

// multiConfig sizes the c100k-multi phase; the heartbeat interval, CPU
// window and broadcasts are the c100k phase's.
type multiConfig struct {
	Conns    int           // connections, over all processes
	Procs    int           // server processes, and as many client processes; 0: as few as the open-file limit allows
	Tail     time.Duration // StartTail interval in every server
	IdleCPU  time.Duration // CPU window with the tails alone, before the clients connect
	Deadline time.Duration // per server mode measured
}

var multiSizes = map[string]multiConfig{
	"full":  {Conns: 100_000, Tail: 10 * time.Millisecond, IdleCPU: 5 * time.Second, Deadline: 8 * time.Minute},
	"quick": {Conns: 20_000, Procs: 2, Tail: 10 * time.Millisecond, IdleCPU: 2 * time.Second, Deadline: 3 * time.Minute},
	"tiny":  {Conns: 400, Procs: 2, Tail: 10 * time.Millisecond, IdleCPU: 200 * time.Millisecond, Deadline: 40 * time.Second},
}

func init() {
	extraPhases["c100k-multi"] = (*bench).c100kMultiPhase
	allPhases = append(allPhases, "c100k-multi")
}

type multiResult struct {
	ran     bool
	procs   int
	connect time.Duration // spawning the clients to the last hello
	// Summed RSS in KiB, after GC: servers before the clients came and
	// with them; clients before dialling and with their streams open.
	srvBase, srvRSS, srvAfter, cliBase, cliRSS int64
	srvStack, srvHeap                          float64 // bytes per stream, servers
	slab                                       int64   // kernel slab growth, bytes, machine-wide
	idleCPU                                    float64 // servers' CPU seconds per minute, tails alone
	srvCPU, cliCPU                             float64 // CPU seconds per minute over the heartbeat window
	beats                                      float64 // heartbeats sent in the window
	broadcasts                                 int
	bcSrvCPU, bcCliCPU                         float64   // CPU seconds per broadcast
	bcSrvSys, bcCliSys                         float64   // of which in the kernel
	all, last                                  histogram // µs: every delivery; each broadcast's last
	err                                        error
}

func (b *bench) c100kMultiPhase(ctx context.Context) error {
	mc := b.cfg.multi
	n := mc.Conns
	perProc := 1 << 30
	if lim := fileLimit(); lim > 0 {
		perProc = int(lim) - fdMargin
	}
	procs := mc.Procs
	if procs <= 0 {
		procs = max(2, (n+perProc-1)/perProc)
	}
	if share := (n + procs - 1) / procs; share > perProc {
		return fmt.Errorf("%d connections in %d processes is %d each, over the open-file limit's %d: use -procs %d or more",
			n, procs, share, perProc, (n+perProc-1)/perProc)
	}
	results := map[string]*multiResult{}
	for _, mode := range b.cfg.C100k.Modes {
		mode = strings.TrimSpace(mode)
		ctx, cancel := context.WithTimeout(ctx, mc.Deadline)
		res := &multiResult{procs: procs}
		if err := b.multiOnce(ctx, res, mode, n, procs); err != nil {
			res.err = err
		}
		cancel()
		results[mode] = res
		b.logf("c100k-multi %s: connect %v, err %v", mode, res.connect, res.err)
	}
	det, hub, raw := results["detach"], results["hub"], results["raw"]
	title := func(what string) string {
		return fmt.Sprintf("c100k-multi, %s connections (%d server + %d client processes, one SQLite file, StartTail %v): %s",
			num(float64(n)), procs, procs, mc.Tail, what)
	}
	one := func(r *multiResult, f func(r *multiResult) string) string {
		switch {
		case r == nil || (!r.ran && r.err == nil):
			return "not run"
		case r.err != nil:
			return "error: " + r.err.Error()
		}
		return f(r)
	}
	both := func(f func(r *multiResult) string) string {
		return "detach: " + one(det, f) + "; today's path: " + one(hub, f)
	}
	ok := func(r *multiResult) bool { return r != nil && r.ran && r.err == nil }
	mib := func(kib int64) string { return fmt.Sprintf("%s MiB", num(float64(kib)/1024)) }
	per := func(kib int64) string { return fmt.Sprintf("%.1f KiB", float64(kib)/float64(n)) }

	connect := func(r *multiResult) string { return r.connect.Round(time.Millisecond).String() }
	b.add(row{Figure: title("connect + hello, all"), Target: "≤ 60 s at 100,000",
		Replayd: both(connect), Raw: "raw: " + one(raw, connect),
		Status: statusAt(ok(det) && det.connect <= 60*time.Second, n)})
	rss := func(r *multiResult) string {
		return fmt.Sprintf("servers %s in all, %s per stream over their idle %s (Go heap %.1f + stacks %.1f KiB; after heartbeats and broadcasts %s); clients %s in all, %s per stream; kernel slab +%s (machine-wide, both ends)",
			mib(r.srvRSS), per(r.srvRSS-r.srvBase), mib(r.srvBase), r.srvHeap/1024, r.srvStack/1024, per(r.srvAfter-r.srvBase),
			mib(r.cliRSS), per(r.cliRSS-r.cliBase), mib(r.slab>>10))
	}
	b.add(row{Figure: title("RSS after GC, servers and clients"), Target: "≤ 12 KiB per stream (detach)",
		Replayd: both(rss), Raw: "raw: " + one(raw, rss),
		Status: statusAt(ok(det) && float64(det.srvRSS-det.srvBase)*1024/float64(n) <= 12<<10, n)})
	b.add(row{Figure: title(fmt.Sprintf("heartbeat CPU (interval %v), all processes", b.cfg.C100k.Heartbeat)),
		Replayd: both(func(r *multiResult) string {
			us := 0.0
			if r.beats > 0 {
				us = (r.srvCPU - r.idleCPU) / 60 * b.cfg.C100k.CPUWindow.Seconds() * 1e6 / r.beats
			}
			return fmt.Sprintf("servers %.2f CPU-s/min (%.2f%% of a core; tails alone %.2f CPU-s/min; %.1f µs per heartbeat), clients %.2f CPU-s/min",
				r.srvCPU, r.srvCPU/60*100, r.idleCPU, us, r.cliCPU)
		}),
		Raw: "raw (no heartbeats, no tail): " + one(raw, func(r *multiResult) string {
			return fmt.Sprintf("servers %.2f CPU-s/min (%.2f before the clients), clients %.2f CPU-s/min", r.srvCPU, r.idleCPU, r.cliCPU)
		})})
	deliveries := func(r *multiResult) string {
		return fmt.Sprintf("every delivery p50 %s, p99 %s, max %s (%d broadcasts); the last delivery of each p50 %s, max %s; CPU per broadcast: servers %.2f s (kernel %.2f), clients %.2f s (kernel %.2f)",
			ms(r.all.quantile(0.5)), ms(r.all.quantile(0.99)), ms(r.all.maximum()), r.broadcasts, ms(r.last.quantile(0.5)), ms(r.last.maximum()),
			r.bcSrvCPU, r.bcSrvSys, r.bcCliCPU, r.bcCliSys)
	}
	bc := row{Figure: title("one broadcast (published in server 1) reaching all"), Target: "p99 ≤ 1 s at 100,000",
		Replayd: both(deliveries), Raw: "raw (no log; published in every server at once): " + one(raw, deliveries)}
	if ok(det) {
		bc.Status = statusAt(det.all.quantile(0.99) <= 1_000_000, n)
		if ok(raw) {
			_, bc.Ratio = ratio(float64(det.all.quantile(0.99)), float64(raw.all.quantile(0.99)))
			bc.Ratio = "p99 detach/raw " + bc.Ratio
		}
	}
	b.add(bc)
	return nil
}

// multiOnce measures one server mode into out.
func (b *bench) multiOnce(ctx context.Context, out *multiResult, mode string, n, procs int) error {
	cfg, mc := b.cfg.C100k, b.cfg.multi
	b.nextDB++
	db := filepath.Join(b.dir, fmt.Sprintf("events-%d.db", b.nextDB))
	life := mc.Deadline + 30*time.Second
	var servers []*serverProc
	var clients []*clientProc
	defer func() { stopAll(servers, clients) }()

	heartbeat := cfg.Heartbeat
	if mode == "raw" {
		heartbeat = -1
	}
	// One after the other: the first creates the schema.
	for i := range procs {
		srv, err := startServer(ctx, serverConfig{Mode: mode, DB: db, Heartbeat: heartbeat, Deadline: life})
		if err != nil {
			return fmt.Errorf("server %d: %w", i+1, err)
		}
		servers = append(servers, srv)
	}
	if err := parallel(procs, func(i int) error {
		if mode == "raw" {
			return nil
		}
		return servers[i].ctl(ctx, "/ctl/tail?interval="+mc.Tail.String(), nil)
	}); err != nil {
		return err
	}
	srvStats := func(gcs int) ([]procStats, error) {
		sts := make([]procStats, procs)
		err := parallel(procs, func(i int) (err error) {
			sts[i], err = servers[i].statsGC(ctx, gcs)
			return err
		})
		return sts, err
	}
	cliStats := func(gcs int) ([]procStats, error) {
		sts := make([]procStats, procs)
		err := parallel(procs, func(i int) error {
			return clients[i].call(ctx, "stats "+strconv.Itoa(gcs), "STATS", &sts[i])
		})
		return sts, err
	}
	// allStats reads the servers' stats, then the clients'.
	allStats := func(gcs int) (srv, cli []procStats, err error) {
		if srv, err = srvStats(gcs); err != nil {
			return nil, nil, err
		}
		cli, err = cliStats(gcs)
		return srv, cli, err
	}
	base, err := srvStats(settleGCs)
	if err != nil {
		return err
	}
	out.srvBase = sum(base, func(s procStats) int64 { return s.RSSKiB })
	// The tails' own CPU, with no stream open.
	c0, err := srvStats(0)
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, mc.IdleCPU); err != nil {
		return err
	}
	c1, err := srvStats(0)
	if err != nil {
		return err
	}
	out.idleCPU = perMinute(c0, c1, mc.IdleCPU)
	slab0 := slabBytes()

	shares := make([]int, procs)
	for i := range n {
		shares[i%procs]++
	}
	start := time.Now()
	nextIP := 2
	for j := range procs {
		ips := sourceIPs(nextIP, (shares[j]+perSource-1)/perSource)
		nextIP += len(ips)
		var src []string
		for _, ip := range ips {
			src = append(src, ip.String())
		}
		c, err := startClient(clientConfig{Addr: servers[j].addr, Conns: shares[j], Sources: src, Parallel: max(16, 256/procs), Deadline: life})
		if err != nil {
			return fmt.Errorf("client %d: %w", j+1, err)
		}
		clients = append(clients, c)
	}
	if err := parallel(procs, func(j int) error {
		if err := clients[j].expectLine(ctx, "READY", &clients[j].ready); err != nil {
			return fmt.Errorf("client %d: %w", j+1, err)
		}
		return nil
	}); err != nil {
		return err
	}
	out.connect = time.Since(start)
	b.logf("c100k-multi %s: %d connected in %v", mode, n, out.connect)
	if err := parallel(procs, func(j int) error { return waitClients(ctx, servers[j], shares[j]) }); err != nil {
		return err
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	sts, cs, err := allStats(settleGCs)
	if err != nil {
		return err
	}
	out.slab = slabBytes() - slab0
	out.srvRSS = sum(sts, func(s procStats) int64 { return s.RSSKiB })
	out.srvHeap = float64(sum(sts, func(s procStats) int64 { return s.HeapInuse })-sum(base, func(s procStats) int64 { return s.HeapInuse })) / float64(n)
	out.srvStack = float64(sum(sts, func(s procStats) int64 { return s.StackInuse })-sum(base, func(s procStats) int64 { return s.StackInuse })) / float64(n)
	out.cliRSS = sum(cs, func(s procStats) int64 { return s.RSSKiB })
	for _, c := range clients {
		out.cliBase += c.ready.Base.RSSKiB
	}

	// Heartbeat CPU: every process idle but for heartbeats (and tails).
	s0, k0, err := allStats(0)
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, cfg.CPUWindow); err != nil {
		return err
	}
	s1, k1, err := allStats(0)
	if err != nil {
		return err
	}
	out.srvCPU, out.cliCPU = perMinute(s0, s1, cfg.CPUWindow), perMinute(k0, k1, cfg.CPUWindow)
	out.beats = float64(n) * cfg.CPUWindow.Seconds() / cfg.Heartbeat.Seconds()

	// Broadcasts: one event on topic "" published in the first server
	// reaches the others' streams through their tails.
	publishers := servers[:1]
	if mode == "raw" {
		publishers = servers
	}
	for range cfg.Broadcasts {
		if err := parallel(procs, func(j int) error { return clients[j].call(ctx, "arm", "ARMED", nil) }); err != nil {
			return err
		}
		s0, k0, err := allStats(0)
		if err != nil {
			return err
		}
		if err := parallel(len(publishers), func(i int) error {
			var pr publishResult
			if err := publishers[i].ctl(ctx, "/ctl/publish?n=1&topic=", &pr); err != nil {
				return err
			}
			if pr.Errors > 0 {
				return fmt.Errorf("publish: %s", pr.FirstErr)
			}
			return nil
		}); err != nil {
			return err
		}
		got := make([]clientGot, procs)
		wait := 30 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if err := parallel(procs, func(j int) error { return clients[j].call(ctx, "wait "+wait.String(), "GOT", &got[j]) }); err != nil {
			return err
		}
		s1, k1, err := allStats(0)
		if err != nil {
			return err
		}
		out.bcSrvCPU += perMinute(s0, s1, time.Minute) / float64(cfg.Broadcasts)
		out.bcCliCPU += perMinute(k0, k1, time.Minute) / float64(cfg.Broadcasts)
		out.bcSrvSys += sysSeconds(s0, s1) / float64(cfg.Broadcasts)
		out.bcCliSys += sysSeconds(k0, k1) / float64(cfg.Broadcasts)
		h := &histogram{}
		for j, g := range got {
			if g.Got < int64(shares[j]) {
				return fmt.Errorf("broadcast: client %d: %d of %d streams got it (%d ended: %s)", j+1, g.Got, shares[j], g.Ended, g.Err)
			}
			h.addSparse(g.Hist, g.Max)
		}
		out.all.merge(h)
		out.last.addAll([]uint64{h.maximum()})
		out.broadcasts++
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
	after, err := srvStats(settleGCs)
	if err != nil {
		return err
	}
	out.srvAfter = sum(after, func(s procStats) int64 { return s.RSSKiB })
	for j, c := range clients {
		var g clientGot
		if err := c.call(ctx, "wait 0s", "GOT", &g); err != nil {
			return err
		}
		if g.Ended > 0 {
			return fmt.Errorf("client %d: %d streams ended during the phase: %s", j+1, g.Ended, g.Err)
		}
	}
	out.ran = true
	return nil
}

func sum(sts []procStats, f func(procStats) int64) int64 {
	var t int64
	for _, s := range sts {
		t += f(s)
	}
	return t
}

// perMinute is the CPU seconds per minute the processes used between two
// readings d apart.
func perMinute(a, b []procStats, d time.Duration) float64 {
	used := sum(b, func(s procStats) int64 { return s.CPUNanos }) - sum(a, func(s procStats) int64 { return s.CPUNanos })
	return time.Duration(used).Seconds() / d.Seconds() * 60
}

// sysSeconds is the system CPU seconds the processes used between two
// readings.
func sysSeconds(a, b []procStats) float64 {
	used := sum(b, func(s procStats) int64 { return s.SysNanos }) - sum(a, func(s procStats) int64 { return s.SysNanos })
	return time.Duration(used).Seconds()
}

// slabBytes is the kernel's slab memory (Slab in /proc/meminfo), where
// socket structures live; 0 if unknown.
func slabBytes() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Slab:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kib << 10
		}
	}
	return 0
}

// parallel runs fn(0) … fn(n-1) at once and joins their errors.
func parallel(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stopAll stops the clients (closing their connections), then the
// servers; it returns when every process has exited.
func stopAll(servers []*serverProc, clients []*clientProc) {
	_ = parallel(len(clients), func(i int) error { clients[i].stop(); return nil })
	_ = parallel(len(servers), func(i int) error { servers[i].stop(); return nil })
}

// sparse is h's non-empty buckets as (bucket, count) pairs.
func (h *histogram) sparse() [][2]uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out [][2]uint64
	for i, c := range h.counts {
		if c > 0 {
			out = append(out, [2]uint64{uint64(i), c})
		}
	}
	return out
}

// addSparse adds a sparse histogram whose largest value is maxV.
func (h *histogram) addSparse(buckets [][2]uint64, maxV uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range buckets {
		if b[0] < uint64(len(h.counts)) {
			h.counts[b[0]] += b[1]
			h.n += b[1]
		}
	}
	h.max = max(h.max, maxV)
}

// The client role: a process holding one leanFleet of SSE streams to one
// server, driven over its stdin and stdout one line at a time. It prints
// "READY {clientReady}" once every stream has its hello (or exits non-zero
// with the reason on stderr), then answers each command with one line:
//
//	stats N    STATS {procStats}, after N GCs
//	arm        ARMED {}: the next event is timed
//	wait D     GOT {clientGot} when every stream has the event, or after D
//
// It exits when its stdin closes, and on its own after its deadline.
const clientRole = "c100k-client"

type clientConfig struct {
	Addr     string        // the server's address
	Conns    int           // streams
	Sources  []string      // loopback source addresses, used in turn
	Parallel int           // handshakes at a time
	Deadline time.Duration // hard limit on the process's life
}

type clientReady struct {
	ConnectNanos int64     `json:"connectNanos"`
	Base         procStats `json:"base"` // before dialling
}

type clientGot struct {
	Got   int64       `json:"got"`   // streams that have the event
	Ended int64       `json:"ended"` // streams that ended
	Err   string      `json:"err,omitempty"`
	Hist  [][2]uint64 `json:"hist"` // latency histogram, sparse
	Max   uint64      `json:"max"`
}

func runClientRole() int {
	var cfg clientConfig
	if err := json.Unmarshal([]byte(os.Getenv(configEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "replayd-bench client: config:", err)
		return 2
	}
	if err := runClient(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "replayd-bench client:", err)
		return 1
	}
	return 0
}

func runClient(cfg clientConfig, stdin io.Reader, stdout io.Writer) error {
	raiseFileLimit()
	deadline := time.AfterFunc(cfg.Deadline, func() {
		fmt.Fprintln(os.Stderr, "replayd-bench client: deadline passed; exiting")
		os.Exit(3)
	})
	defer deadline.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmds := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
		cancel() // the orchestrator is gone: abandon a dial under way
	}()
	var srcs []net.IP
	for _, s := range cfg.Sources {
		srcs = append(srcs, net.ParseIP(s))
	}
	if len(srcs) == 0 {
		srcs = sourceIPs(2, 1)
	}
	ready := clientReady{Base: selfStats(settleGCs)}
	start := time.Now()
	f, err := dialLeanFrom(ctx, cfg.Addr, cfg.Conns, cfg.Parallel, srcs)
	if err != nil {
		return err
	}
	defer f.close()
	ready.ConnectNanos = int64(time.Since(start))
	send := func(verb string, v any) error {
		js, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s %s\n", verb, js)
		return err
	}
	if err := send("READY", ready); err != nil {
		return err
	}
	reached := f.expect()
	for line := range cmds {
		verb, arg, _ := strings.Cut(line, " ")
		switch verb {
		case "stats":
			gcs, _ := strconv.Atoi(arg)
			err = send("STATS", selfStats(gcs))
		case "arm":
			reached = f.expect()
			err = send("ARMED", struct{}{})
		case "wait":
			d, _ := time.ParseDuration(arg)
			t := time.NewTimer(d)
			select {
			case <-reached:
			case <-t.C:
			}
			t.Stop()
			h := f.latency()
			g := clientGot{Got: f.got.Load(), Ended: f.ended.Load(), Hist: h.sparse(), Max: h.maximum()}
			if e := f.firstErr(); e != nil {
				g.Err = fmt.Sprint(e)
			}
			err = send("GOT", g)
		default:
			err = send("ERR", "unknown command "+verb)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// clientProc is a running client child, seen from the orchestrator.
type clientProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // its stdout, closed at EOF
	stderr *tailBuffer
	waited chan error
	ready  clientReady
}

// startClient spawns this executable in the client role.
func startClient(cfg clientConfig) (*clientProc, error) {
	ch, err := startChild(clientRole, cfg)
	if err != nil {
		return nil, err
	}
	cmd, stdout := ch.cmd, ch.stdout
	c := &clientProc{cmd: cmd, stdin: ch.stdin, lines: make(chan string, 64), stderr: ch.stderr, waited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.waited <- cmd.Wait() // after the last read, as Wait requires
	}()
	return c, nil
}

// call sends one command and decodes its answer, which must be verb.
func (c *clientProc) call(ctx context.Context, cmd, verb string, out any) error {
	if _, err := fmt.Fprintln(c.stdin, cmd); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return c.expectLine(ctx, verb, out)
}

// expectLine reads the client's next line, which must be verb, into out.
func (c *clientProc) expectLine(ctx context.Context, verb string, out any) error {
	select {
	case line, ok := <-c.lines:
		if !ok {
			return fmt.Errorf("client exited: %s", c.stderr)
		}
		v, js, _ := strings.Cut(line, " ")
		if v != verb {
			return fmt.Errorf("client answered %q, want %s", line, verb)
		}
		if out == nil {
			return nil
		}
		return json.Unmarshal([]byte(js), out)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop closes the client's stdin, which makes it close its streams and
// exit, and kills it if it has not exited within 10s.
func (c *clientProc) stop() {
	c.stdin.Close()
	kill := time.NewTimer(10 * time.Second)
	defer kill.Stop()
	lines := c.lines
	for {
		select {
		case <-c.waited:
			return
		case _, ok := <-lines: // unread answers
			if !ok {
				lines = nil
			}
		case <-kill.C:
			_ = c.cmd.Process.Kill()
		}
	}
}
