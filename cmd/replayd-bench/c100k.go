package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The c100k phase: N concurrent SSE connections to one server process,
// from this process, spread over several loopback source addresses
// (127.0.0.2, 127.0.0.3, …) so no source runs out of ephemeral ports. For
// the raw net/http ceiling, today's hub and the hub with
// DetachConnections, one after the other: connect time for all N, server
// RSS per idle connection (after GC), heartbeat CPU, and broadcasts that
// reach all N (time to last delivery).

type c100kConfig struct {
	Conns      int           // connections
	Heartbeat  time.Duration // the hub's HeartbeatInterval
	CPUWindow  time.Duration // heartbeat CPU is measured over this
	Broadcasts int           // broadcasts timed
	Deadline   time.Duration // per server measured
	Modes      []string      // raw, hub, detach
}

// perSource is the most connections put on one source address: well under
// the 28,232 ports of Linux's default ephemeral range.
const perSource = 15_000

// settleGCs is how many collections run before memory is read: an idle
// goroutine's stack is halved by a collection at most, down to what it
// uses, so a long-running server's idle streams sit at the settled size.
const settleGCs = 4

// fdMargin is the descriptors kept for everything but the connections.
const fdMargin = 300

func (b *bench) c100kPhase(ctx context.Context) error {
	cfg := b.cfg.C100k
	n := cfg.Conns
	note := ""
	if lim := fileLimit(); lim > 0 && uint64(n)+fdMargin > lim {
		// Both processes hold one descriptor per connection, and neither
		// may raise its hard limit (that needs CAP_SYS_RESOURCE).
		clamped := int(lim) - fdMargin
		note = fmt.Sprintf("clamped from %s: RLIMIT_NOFILE hard limit is %d; ", num(float64(n)), lim)
		n = clamped
	}
	results := map[string]c100kResult{}
	for _, mode := range cfg.Modes {
		mode = strings.TrimSpace(mode)
		ctx, cancel := context.WithTimeout(ctx, cfg.Deadline)
		res, err := b.c100kOnce(ctx, mode, n)
		cancel()
		if err != nil {
			res.err = err
		}
		results[mode] = res
		b.logf("c100k %s: %+v", mode, res)
	}
	raw, hub, det := results["raw"], results["hub"], results["detach"]
	title := func(what string) string {
		return fmt.Sprintf("c100k, %s connections (%s%d source addresses): %s", num(float64(n)), note, sources(n), what)
	}
	connectOK := func(r c100kResult) bool { return r.err == nil && r.connect <= 60*time.Second }
	b.add(row{Figure: title("connect + hello, all"), Replayd: "hub: " + det.str(func(r c100kResult) string { return r.connect.Round(time.Millisecond).String() }, hub, "detach"),
		Raw:    "raw: " + raw.str(func(r c100kResult) string { return r.connect.Round(time.Millisecond).String() }, c100kResult{}, ""),
		Target: "≤ 60 s at 100,000", Status: statusAt(connectOK(det), n)})
	perConn := func(r c100kResult) string {
		return fmt.Sprintf("%.1f KiB (%.1f before GC; Go heap %.1f + stacks %.1f; %.2f goroutines/conn); after heartbeats and broadcasts %.1f KiB (stacks %.1f)",
			r.perConnGC/1024, r.perConn/1024, r.heap/1024, r.stack/1024, r.goroutines, r.perConnAfter/1024, r.stackAfter/1024)
	}
	mem := row{Figure: title("server RSS per idle connection, after GC"),
		Replayd: det.str(perConn, hub, "detach"), Raw: "raw net/http: " + raw.str(perConn, c100kResult{}, ""),
		Target: "≤ 12 KiB (detach) at 100,000"}
	if det.err == nil && hub.err == nil {
		_, s1 := ratio(det.perConnGC, hub.perConnGC)
		mem.Ratio = "detach/hub " + s1
		if raw.err == nil {
			_, s2 := ratio(det.perConnGC, raw.perConnGC)
			mem.Ratio += ", detach/raw " + s2
		}
		mem.Status = statusAt(det.perConnGC <= 12<<10, n)
	}
	b.add(mem)
	cpu := func(r c100kResult) string {
		return fmt.Sprintf("%.2f%% of a core (%.1f µs per heartbeat)", r.hbCPU*100, r.hbMicros)
	}
	b.add(row{Figure: title(fmt.Sprintf("heartbeat CPU (interval %v)", cfg.Heartbeat)),
		Replayd: det.str(cpu, hub, "detach"), Raw: "raw (no heartbeats): " + raw.str(func(r c100kResult) string { return fmt.Sprintf("%.2f%% of a core", r.hbCPU*100) }, c100kResult{}, "")})
	bc := func(r c100kResult) string {
		return fmt.Sprintf("to last delivery p50 %s, p99 %s (of %d broadcasts); all deliveries p50 %s, p99 %s", ms(r.lastP50), ms(r.lastP99), r.broadcasts, ms(r.allP50), ms(r.allP99))
	}
	bcRow := row{Figure: title("one broadcast reaching all"), Replayd: det.str(bc, hub, "detach"), Raw: "raw: " + raw.str(bc, c100kResult{}, ""),
		Target: "p99 ≤ 1 s at 100,000"}
	if det.err == nil {
		bcRow.Status = statusAt(det.allP99 <= 1_000_000, n)
	}
	b.add(bcRow)
	return nil
}

// statusAt is status for a target set at 100,000 connections, measured
// at n.
func statusAt(ok bool, n int) string {
	if n >= 100_000 {
		return status(ok)
	}
	return status(ok) + " at " + num(float64(n)) + " (not measured at 100,000)"
}

// str formats r (and other, labelled, when it is set) with f.
func (r c100kResult) str(f func(c100kResult) string, other c100kResult, label string) string {
	one := func(r c100kResult) string {
		if r.err != nil {
			return "error: " + r.err.Error()
		}
		if !r.ran {
			return "not run"
		}
		return f(r)
	}
	if label == "" {
		return one(r)
	}
	return label + ": " + one(r) + "; today's path: " + one(other)
}

type c100kResult struct {
	ran       bool
	connect   time.Duration
	perConn   float64 // RSS bytes per connection
	perConnGC float64 // same, after GC + FreeOSMemory
	heap      float64 // Go heap in use per connection
	stack     float64 // goroutine stacks per connection
	// perConnAfter and stackAfter are perConnGC and stack again after the
	// heartbeat window and the broadcasts.
	perConnAfter, stackAfter float64
	goroutines               float64 // per connection
	hbCPU                    float64 // server CPU over the window, fraction of a core
	hbMicros                 float64 // µs of server CPU per heartbeat sent
	broadcasts               int
	lastP50                  uint64 // µs from publish to the last client's receipt
	lastP99                  uint64
	allP50                   uint64 // µs, every delivery of every broadcast
	allP99                   uint64
	err                      error
}

func (b *bench) c100kOnce(ctx context.Context, mode string, n int) (c100kResult, error) {
	cfg := b.cfg.C100k
	var out c100kResult
	heartbeat := cfg.Heartbeat
	if mode == "raw" {
		heartbeat = -1
	}
	b.nextDB++
	srv, err := startServer(ctx, serverConfig{
		Mode:      mode,
		DB:        filepath.Join(b.dir, fmt.Sprintf("events-%d.db", b.nextDB)),
		Heartbeat: heartbeat,
		Deadline:  cfg.Deadline + 15*time.Second,
	})
	if err != nil {
		return out, err
	}
	defer srv.stop()
	// Warm up with one connection, so code paths and pools are in place.
	warm, err := dialLean(ctx, srv.addr, 1, 1)
	if err != nil {
		return out, err
	}
	warm.close()
	if err := waitClients(ctx, srv, 0); err != nil {
		return out, err
	}
	s0, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	s0gc, err := srv.statsGC(ctx, settleGCs)
	if err != nil {
		return out, err
	}
	start := time.Now()
	f, err := dialLean(ctx, srv.addr, n, 256)
	if err != nil {
		return out, err
	}
	defer f.close()
	out.connect = time.Since(start)
	b.logf("c100k %s: %d connected in %v", mode, n, out.connect)
	if err := waitClients(ctx, srv, n); err != nil {
		return out, err
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return out, err
	}
	s1, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	s1gc, err := srv.statsGC(ctx, settleGCs)
	if err != nil {
		return out, err
	}
	out.perConn = float64(s1.RSSKiB-s0.RSSKiB) * 1024 / float64(n)
	out.perConnGC = float64(s1gc.RSSKiB-s0gc.RSSKiB) * 1024 / float64(n)
	out.heap = float64(s1gc.HeapInuse-s0gc.HeapInuse) / float64(n)
	out.stack = float64(s1gc.StackInuse-s0gc.StackInuse) / float64(n)
	out.goroutines = float64(s1gc.Goroutines-s0gc.Goroutines) / float64(n)

	// Heartbeat CPU: the server idle but for heartbeats.
	c0, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	if err := sleepCtx(ctx, cfg.CPUWindow); err != nil {
		return out, err
	}
	c1, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	cpu := time.Duration(c1.CPUNanos - c0.CPUNanos)
	out.hbCPU = cpu.Seconds() / cfg.CPUWindow.Seconds()
	if heartbeat > 0 {
		beats := float64(n) * cfg.CPUWindow.Seconds() / heartbeat.Seconds()
		out.hbMicros = float64(cpu.Microseconds()) / beats
	}

	// Broadcasts: one event on topic "" reaches every connection.
	all := &histogram{}
	last := &histogram{}
	for range cfg.Broadcasts {
		done := f.expect()
		var pr publishResult
		if err := srv.ctl(ctx, "/ctl/publish?n=1&topic=", &pr); err != nil {
			return out, err
		}
		if pr.Errors > 0 {
			return out, fmt.Errorf("publish: %s", pr.FirstErr)
		}
		select {
		case <-done:
		case <-ctx.Done():
			return out, fmt.Errorf("broadcast: %d of %d clients got it: %w", f.got.Load(), n, ctx.Err())
		}
		h := f.latency()
		all.merge(h)
		last.addAll([]uint64{h.maximum()})
		out.broadcasts++
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return out, err
		}
	}
	// Memory again, now that every stream has written heartbeats and
	// broadcasts: a goroutine that needed a deeper stack for a write keeps
	// it.
	s2gc, err := srv.statsGC(ctx, settleGCs)
	if err != nil {
		return out, err
	}
	out.perConnAfter = float64(s2gc.RSSKiB-s0gc.RSSKiB) * 1024 / float64(n)
	out.stackAfter = float64(s2gc.StackInuse-s0gc.StackInuse) / float64(n)
	out.lastP50, out.lastP99 = last.quantile(0.5), last.quantile(0.99)
	out.allP50, out.allP99 = all.quantile(0.5), all.quantile(0.99)
	if dead := f.ended.Load(); dead > 0 {
		return out, fmt.Errorf("%d streams ended during the phase: %v", dead, f.firstErr())
	}
	out.ran = true
	return out, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sources is how many source addresses n connections use.
func sources(n int) int { return max(2, (n+perSource-1)/perSource) }

// fileLimit is RLIMIT_NOFILE's current (raised) soft limit; 0 if unknown.
func fileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return lim.Cur
}

// leanFleet is many SSE connections at a few hundred bytes of client
// state each (a goroutine, a 512-byte bufio.Reader): it reads line by
// line, notes the hello, and times each event against the publish time
// stamped in its payload. Chunk-size lines of a chunked response are
// skipped like any other line: each server write is one chunk, so a frame
// never straddles two.
type leanFleet struct {
	conns []net.Conn
	wg    sync.WaitGroup
	hists [16]histogram

	got     atomic.Int64 // clients that got the current broadcast
	want    int64
	mu      sync.Mutex
	reached chan struct{}

	ended atomic.Int64
	err   atomic.Value
}

// dialLean opens n streams at addr, parallel handshakes at a time, over
// several source addresses, and waits for every hello.
func dialLean(ctx context.Context, addr string, n, parallel int) (*leanFleet, error) {
	return dialLeanFrom(ctx, addr, n, parallel, sourceIPs(2, sources(n)))
}

// sourceIPs is count loopback addresses from 127.0.0.first on.
func sourceIPs(first, count int) []net.IP {
	ips := make([]net.IP, count)
	for i := range ips {
		ips[i] = net.IPv4(127, 0, byte((first+i)>>8), byte(first+i))
	}
	return ips
}

// dialLeanFrom is dialLean with connection i from srcs[i%len(srcs)].
func dialLeanFrom(ctx context.Context, addr string, n, parallel int, srcs []net.IP) (*leanFleet, error) {
	f := &leanFleet{conns: make([]net.Conn, n), want: int64(n), reached: make(chan struct{})}
	sem := make(chan struct{}, parallel)
	errc := make(chan error, n)
	var dialing sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			errc <- ctx.Err()
		}
		if ctx.Err() != nil {
			break
		}
		dialing.Add(1)
		go func() {
			defer dialing.Done()
			defer func() { <-sem }()
			if err := f.dial(ctx, i, addr, srcs[i%len(srcs)]); err != nil {
				errc <- fmt.Errorf("connection %d: %w", i, err)
			}
		}()
	}
	dialing.Wait()
	close(errc)
	if err := <-errc; err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *leanFleet) dial(ctx context.Context, i int, addr string, src net.IP) error {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: src}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	f.conns[i] = conn
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(conn, "GET /events?topic=c-%02d HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", i%100, addr); err != nil {
		return err
	}
	br := bufio.NewReaderSize(conn, 512)
	status, err := br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(status, []byte("HTTP/1.1 200")) {
		return fmt.Errorf("status %q", strings.TrimSpace(string(status)))
	}
	for { // to the hello's event line
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("before hello: %w", err)
		}
		if bytes.Equal(line, []byte("event: hello\n")) {
			break
		}
	}
	f.wg.Add(1)
	go f.read(i, br)
	return nil
}

var stampLine = []byte(`data: {"t":`)

func (f *leanFleet) read(i int, br *bufio.Reader) {
	defer f.wg.Done()
	var lat [1]uint64
	message := false
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
				f.err.CompareAndSwap(nil, err)
			}
			f.ended.Add(1)
			return
		}
		now := time.Now().UnixNano()
		switch {
		case bytes.Equal(line, []byte("event: message\n")):
			message = true
			continue
		case message && bytes.HasPrefix(line, stampLine):
			rest := line[len(stampLine):]
			j := 0
			for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
				j++
			}
			if t, err := strconv.ParseInt(string(rest[:j]), 10, 64); err == nil && now > t {
				lat[0] = uint64(now-t) / 1000
				f.hists[i%len(f.hists)].addAll(lat[:])
			}
			if f.got.Add(1) == f.want {
				f.mu.Lock()
				close(f.reached)
				f.mu.Unlock()
			}
		}
		message = false
	}
}

// expect clears the latencies and returns a channel closed when every
// client got the next event.
func (f *leanFleet) expect() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.hists {
		f.hists[i].mu.Lock()
		f.hists[i].counts = [len(f.hists[i].counts)]uint64{}
		f.hists[i].n, f.hists[i].max = 0, 0
		f.hists[i].mu.Unlock()
	}
	f.got.Store(0)
	f.reached = make(chan struct{})
	return f.reached
}

func (f *leanFleet) latency() *histogram {
	h := &histogram{}
	for i := range f.hists {
		h.merge(&f.hists[i])
	}
	return h
}

func (f *leanFleet) firstErr() any { return f.err.Load() }

func (f *leanFleet) close() {
	for _, c := range f.conns {
		if c != nil {
			c.Close()
		}
	}
	f.wg.Wait()
}
