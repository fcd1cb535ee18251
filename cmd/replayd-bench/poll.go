package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The poll phases (issue 10), with the poll clients: like the SSE fleet,
// bare TCP connections with a hand-written GET and net/http's response
// reader, kept alive from one poll to the next.

// pollConn is one keep-alive connection to the poll endpoint.
type pollConn struct {
	conn net.Conn
	br   *bufio.Reader
	host string
	stop func() bool // unregisters the context's AfterFunc
	req  []byte
	body bytes.Buffer
}

// dialPoll connects to addr; ending ctx ends every read and write on it.
func dialPoll(ctx context.Context, addr string) (*pollConn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &pollConn{conn: conn, br: bufio.NewReaderSize(conn, 4<<10), host: addr}
	p.stop = context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	return p, nil
}

func (p *pollConn) close() {
	p.stop()
	p.conn.Close()
}

// send writes a GET of path.
func (p *pollConn) send(path string) error {
	p.req = append(p.req[:0], "GET "...)
	p.req = append(p.req, path...)
	p.req = append(p.req, " HTTP/1.1\r\nHost: "...)
	p.req = append(p.req, p.host...)
	p.req = append(p.req, "\r\n\r\n"...)
	_, err := p.conn.Write(p.req)
	return err
}

// recv reads one response. The body is valid until the next recv.
func (p *pollConn) recv() (status int, body []byte, err error) {
	resp, err := http.ReadResponse(p.br, nil)
	if err != nil {
		return 0, nil, err
	}
	p.body.Reset()
	_, err = p.body.ReadFrom(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, p.body.Bytes(), err
}

// get sends a GET and reads its answer, which must be 200.
func (p *pollConn) get(path string) ([]byte, error) {
	if err := p.send(path); err != nil {
		return nil, err
	}
	status, body, err := p.recv()
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("GET %s: status %d: %.200s", path, status, body)
	}
	return body, err
}

var (
	cursorKey = []byte(`"cursor":`)
	eventKey  = []byte(`{"id":`)
)

// answerCursor reads the cursor of a poll answer (the first "cursor" key:
// the answer's own, which precedes the gap and the events).
func answerCursor(body []byte) (int64, bool) {
	i := bytes.Index(body, cursorKey)
	if i < 0 {
		return 0, false
	}
	rest := body[i+len(cursorKey):]
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return n, err == nil
}

// answerEvents counts the events of a poll answer: objects whose "id" is a
// number (the payload's own objects may have an "id" too, a string here).
func answerEvents(body []byte) int {
	n := 0
	for {
		i := bytes.Index(body, eventKey)
		if i < 0 {
			return n
		}
		body = body[i+len(eventKey):]
		if len(body) > 0 && body[0] >= '0' && body[0] <= '9' {
			n++
		}
	}
}

// waitConns waits until the hub counts sse open streams and poll waiting
// long polls.
func waitConns(ctx context.Context, srv *serverProc, sse, poll int64) error {
	for {
		var c connCounts
		if err := srv.ctl(ctx, "/ctl/conns", &c); err != nil {
			return err
		}
		if c.SSE == sse && c.Poll == poll {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("hub has %d streams and %d waiting polls, want %d and %d: %w", c.SSE, c.Poll, sse, poll, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pollWaitPhase: N long polls wait on one topic (each registered as a
// waiter in the server), and one event is published; measured: the time
// from the publish until each poll has its answer, and the server's memory
// per waiting poll. Then, on a fresh server, the same memory figure for N
// idle SSE streams on one topic: a waiting poll should cost no more.
func (b *bench) pollWaitPhase(ctx context.Context) error {
	n := b.cfg.extra.WaitPolls
	var polls, streams memPer
	var lat *histogram
	var missed int
	err := b.withDeadline(ctx, func(ctx context.Context) error {
		var err error
		polls, lat, missed, err = b.pollWaitOnce(ctx, n)
		return err
	})
	if err != nil {
		polls.err = err
	}
	err = b.withDeadline(ctx, func(ctx context.Context) error {
		var err error
		streams, err = b.sseIdleOnce(ctx, n)
		return err
	})
	if err != nil {
		streams.err = err
	}
	r := row{Figure: fmt.Sprintf("%s waiting long polls on one topic, one publish: time until each has its answer", num(float64(n)))}
	if polls.err != nil {
		r.Replayd = "error: " + polls.err.Error()
	} else {
		r.Replayd = fmt.Sprintf("p50 %s, p99 %s, all %s (%d answers; %.0f µs server CPU per answer)",
			ms(lat.quantile(0.5)), ms(lat.quantile(0.99)), ms(lat.maximum()), lat.count(), float64(polls.wakeCPU.Nanoseconds())/1e3)
		if missed > 0 {
			r.Replayd += fmt.Sprintf("; %d polls got no event", missed)
		}
	}
	b.add(r)
	m := row{Figure: fmt.Sprintf("memory per waiting long poll (RSS after GC, 0 → %s)", num(float64(n))),
		Replayd: polls.String(), Raw: "idle SSE stream, one topic: " + streams.String(), Target: "≤ 1× idle SSE stream"}
	if polls.err == nil && streams.err == nil {
		x, s := ratio(polls.perGC, streams.perGC)
		m.Ratio, m.Status = s, status(x <= 1)
	}
	b.add(m)
	return nil
}

// memPer is a server's memory cost per connection.
type memPer struct {
	perGC      float64 // RSS delta after GC + FreeOSMemory, bytes
	heapStack  float64 // Go heap in use + stacks, bytes
	goroutines float64
	wakeCPU    time.Duration // server CPU per poll from the publish until every poll has its answer
	err        error
}

func (m memPer) String() string {
	if m.err != nil {
		return "error: " + m.err.Error()
	}
	return fmt.Sprintf("%.1f KiB (Go heap+stacks %.1f KiB; %.2f goroutines)", m.perGC/1024, m.heapStack/1024, m.goroutines)
}

func memDelta(s0, s1 procStats, n int) memPer {
	return memPer{
		perGC:      float64(s1.RSSKiB-s0.RSSKiB) * 1024 / float64(n),
		heapStack:  float64(s1.HeapInuse+s1.StackInuse-s0.HeapInuse-s0.StackInuse) / float64(n),
		goroutines: float64(s1.Goroutines-s0.Goroutines) / float64(n),
	}
}

func (b *bench) pollWaitOnce(ctx context.Context, n int) (mem memPer, lat *histogram, missed int, err error) {
	srv, err := b.server(ctx, "hub", 0, 0)
	if err != nil {
		return mem, nil, 0, err
	}
	defer srv.stop()
	// Warm up: one poll that waits and is answered, so code paths and
	// pools are in place.
	warm, err := dialPoll(ctx, srv.addr)
	if err != nil {
		return mem, nil, 0, err
	}
	if _, err := warm.get("/poll?topic=warm&wait=0.01"); err != nil {
		warm.close()
		return mem, nil, 0, err
	}
	warm.close()
	time.Sleep(b.cfg.extra.WaitSettle)
	s0, err := srv.stats(ctx, true)
	if err != nil {
		return mem, nil, 0, err
	}

	// n polls from cursor 0 (the head: the log is empty) on topic "wait",
	// each re-polling with the cursor it was given if its wait runs out
	// before the event comes, as a client would.
	conns := make([]*pollConn, n)
	answered := make([]atomic.Int64, n) // unix ns of the answer with the event
	var readers sync.WaitGroup
	var firstErr atomic.Value
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.close()
			}
		}
		readers.Wait()
	}()
	sem := make(chan struct{}, 200)
	var dialing sync.WaitGroup
	for i := range n {
		dialing.Add(1)
		sem <- struct{}{}
		go func() {
			defer dialing.Done()
			defer func() { <-sem }()
			c, err := dialPoll(ctx, srv.addr)
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
				return
			}
			conns[i] = c
			if err := c.send("/poll?topic=wait&cursor=0&wait=30"); err != nil {
				firstErr.CompareAndSwap(nil, err)
				return
			}
			readers.Add(1)
			go func() {
				defer readers.Done()
				for {
					status, body, err := c.recv()
					now := time.Now().UnixNano()
					if err != nil || status != http.StatusOK {
						if ctx.Err() == nil {
							firstErr.CompareAndSwap(nil, fmt.Errorf("poll %d: status %d: %v", i, status, err))
						}
						return
					}
					if answerEvents(body) > 0 {
						answered[i].Store(now)
						return
					}
					cursor, _ := answerCursor(body)
					if err := c.send("/poll?topic=wait&wait=30&cursor=" + strconv.FormatInt(cursor, 10)); err != nil {
						return
					}
				}
			}()
		}()
	}
	dialing.Wait()
	if e, _ := firstErr.Load().(error); e != nil {
		return mem, nil, 0, e
	}
	if err := waitConns(ctx, srv, 0, int64(n)); err != nil {
		return mem, nil, 0, err
	}
	time.Sleep(b.cfg.extra.WaitSettle)
	s1, err := srv.stats(ctx, true)
	if err != nil {
		return mem, nil, 0, err
	}
	mem = memDelta(s0, s1, n)
	if err := waitConns(ctx, srv, 0, int64(n)); err != nil {
		return mem, nil, 0, fmt.Errorf("after the memory reading (did waits run out?): %w", err)
	}

	c0, err := srv.stats(ctx, false)
	if err != nil {
		return mem, nil, 0, err
	}
	var pr publishResult
	if err := srv.ctl(ctx, "/ctl/publish?n=1&topic=wait", &pr); err != nil {
		return mem, nil, 0, err
	}
	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if c1, err := srv.stats(ctx, false); err == nil {
		mem.wakeCPU = time.Duration(c1.CPUNanos-c0.CPUNanos) / time.Duration(n)
	}
	lat = &histogram{}
	var us []uint64
	for i := range answered {
		t := answered[i].Load()
		if t == 0 {
			missed++
			continue
		}
		us = append(us, uint64(max(t-pr.StartNanos, 0))/1000)
	}
	lat.addAll(us)
	if e, _ := firstErr.Load().(error); e != nil {
		return mem, lat, missed, e
	}
	if missed > 0 && ctx.Err() != nil {
		return mem, lat, missed, fmt.Errorf("deadline: %d of %d polls answered", n-missed, n)
	}
	return mem, lat, missed, nil
}

// sseIdleOnce measures a fresh server's memory per idle SSE stream, n
// streams on one topic, as pollWaitOnce does for waiting polls.
func (b *bench) sseIdleOnce(ctx context.Context, n int) (memPer, error) {
	srv, err := b.server(ctx, "hub", 0, 0)
	if err != nil {
		return memPer{}, err
	}
	defer srv.stop()
	f, err := dialFleet(ctx, srv.addr, 1, 1, func(int) string { return "/events?topic=warm" }, nil, 0)
	if err != nil {
		return memPer{}, err
	}
	f.close()
	if err := waitClients(ctx, srv, 0); err != nil {
		return memPer{}, err
	}
	time.Sleep(b.cfg.extra.WaitSettle)
	s0, err := srv.stats(ctx, true)
	if err != nil {
		return memPer{}, err
	}
	f, err = dialFleet(ctx, srv.addr, n, 200, func(int) string { return "/events?topic=wait" }, nil, 0)
	if err != nil {
		return memPer{}, err
	}
	defer f.close()
	if err := waitClients(ctx, srv, n); err != nil {
		return memPer{}, err
	}
	time.Sleep(b.cfg.extra.WaitSettle)
	s1, err := srv.stats(ctx, true)
	if err != nil {
		return memPer{}, err
	}
	return memDelta(s0, s1, n), nil
}

// pollRatePhase: C clients poll in a loop with small pages (limit L,
// wait=0), each passing its cursor back, from cursors spread over a
// backlog while a publisher keeps adding events; answered polls per second
// over a window, against the raw ceiling: a net/http handler answering a
// fixed body, a real answer of L events captured from the hub.
func (b *bench) pollRatePhase(ctx context.Context) error {
	x := b.cfg.extra
	var hub, raw pollLoad
	var body []byte
	err := b.withDeadline(ctx, func(ctx context.Context) error {
		var err error
		hub, body, err = b.pollRateHub(ctx)
		return err
	})
	if err != nil {
		hub.err = err
	}
	if body != nil {
		err = b.withDeadline(ctx, func(ctx context.Context) error {
			var err error
			raw, err = b.pollRateRaw(ctx, body)
			return err
		})
		if err != nil {
			raw.err = err
		}
	} else {
		raw.err = errors.New("no answer captured from the hub")
	}
	r := row{Figure: fmt.Sprintf("poll throughput, %d clients, limit=%d, wait=0, answers/s", x.PollClients, x.PollLimit),
		Replayd: hub.String(), Raw: fmt.Sprintf("raw fixed %d-byte answer: %s", len(body), raw.String()), Target: "≥ 0.5× raw"}
	if hub.err == nil && raw.err == nil {
		x, s := ratio(hub.rate(), raw.rate())
		r.Ratio, r.Status = s, status(x >= 0.5)
	}
	b.add(r)
	return nil
}

// pollLoad is one poll throughput measurement.
type pollLoad struct {
	answers, events, bytes int64
	secs                   float64
	cpu                    time.Duration // server CPU over the window
	err                    error
}

func (l pollLoad) rate() float64 { return float64(l.answers) / l.secs }

func (l pollLoad) String() string {
	if l.err != nil {
		return "error: " + l.err.Error()
	}
	if l.answers == 0 {
		return "no answers"
	}
	return fmt.Sprintf("%s (%.1f events/answer, %.0f B/answer; %.1f µs server CPU/answer)", num(l.rate()),
		float64(l.events)/float64(l.answers), float64(l.bytes)/float64(l.answers), float64(l.cpu.Microseconds())/float64(l.answers))
}

func (b *bench) pollRateHub(ctx context.Context) (pollLoad, []byte, error) {
	x := b.cfg.extra
	srv, err := b.server(ctx, "hub", 0, -1)
	if err != nil {
		return pollLoad{}, nil, err
	}
	defer srv.stop()
	c, err := dialPoll(ctx, srv.addr)
	if err != nil {
		return pollLoad{}, nil, err
	}
	// The backlog's sequences start above the head of the new log, which
	// its open raised to the clock (the sequence floor): a fresh poll
	// names it.
	fresh, err := c.get("/poll?topic=p")
	if err != nil {
		c.close()
		return pollLoad{}, nil, err
	}
	var first struct{ Head int64 }
	if err := json.Unmarshal(fresh, &first); err != nil {
		c.close()
		return pollLoad{}, nil, fmt.Errorf("fresh poll: %w", err)
	}
	base := first.Head
	var pr publishResult
	if err := srv.ctl(ctx, fmt.Sprintf("/ctl/publish?n=%d&conc=64&topic=p", x.PollBacklog), &pr); err != nil {
		c.close()
		return pollLoad{}, nil, err
	}
	if pr.Errors > 0 {
		c.close()
		return pollLoad{}, nil, fmt.Errorf("%d publishes failed: %s", pr.Errors, pr.FirstErr)
	}
	// The body the raw ceiling will answer: a page from the middle of the
	// backlog.
	body, err := c.get(fmt.Sprintf("/poll?topic=p&limit=%d&cursor=%d", x.PollLimit, base+pr.Published/2))
	body = bytes.Clone(body)
	c.close()
	if err != nil {
		return pollLoad{}, nil, err
	}
	if got := answerEvents(body); got != x.PollLimit {
		return pollLoad{}, nil, fmt.Errorf("captured answer holds %d events, want %d", got, x.PollLimit)
	}
	// A publisher adds events while the clients poll.
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan error, 1)
	go func() {
		n := int(float64(x.PollRate) * (x.PollWarm + x.PollDur + 5*time.Second).Seconds())
		pubDone <- srv.ctl(pubCtx, fmt.Sprintf("/ctl/publish?n=%d&rate=%d&conc=4&topic=p", n, x.PollRate), nil)
	}()
	backlog := pr.Published
	load := b.pollLoadRun(ctx, srv, "hub", x.PollClients, func(i int) int64 { return base + int64(i)*backlog/int64(x.PollClients) },
		func(cursor int64) string {
			return "/poll?topic=p&limit=" + strconv.Itoa(x.PollLimit) + "&cursor=" + strconv.FormatInt(cursor, 10)
		})
	stopPub()
	<-pubDone
	return load, body, load.err
}

func (b *bench) pollRateRaw(ctx context.Context, body []byte) (pollLoad, error) {
	x := b.cfg.extra
	srv, err := b.server(ctx, "raw", 0, -1)
	if err != nil {
		return pollLoad{}, err
	}
	defer srv.stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+srv.addr+"/ctl/pollbody", bytes.NewReader(body))
	if err != nil {
		return pollLoad{}, err
	}
	resp, err := srv.client.Do(req)
	if err != nil {
		return pollLoad{}, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	load := b.pollLoadRun(ctx, srv, "raw", x.PollClients, func(i int) int64 { return 0 },
		func(cursor int64) string {
			return "/poll?topic=p&limit=" + strconv.Itoa(x.PollLimit) + "&cursor=" + strconv.FormatInt(cursor, 10)
		})
	return load, load.err
}

// pollLoadRun runs clients that poll in a loop, client i from cursor
// start(i), each passing back the cursor of the answer it got, and counts
// the answers received within the window (after PollWarm, for PollDur).
func (b *bench) pollLoadRun(ctx context.Context, srv *serverProc, name string, clients int, start func(i int) int64, path func(cursor int64) string) pollLoad {
	x := b.cfg.extra
	var out pollLoad
	conns := make([]*pollConn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.close()
			}
		}
	}()
	for i := range conns {
		c, err := dialPoll(ctx, srv.addr)
		if err != nil {
			out.err = err
			return out
		}
		conns[i] = c
	}
	t0 := time.Now()
	open, shut := t0.Add(x.PollWarm), t0.Add(x.PollWarm+x.PollDur)
	var answers, events, nbytes atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cursor := start(i)
			var a, e, n int64
			for {
				body, err := c.get(path(cursor))
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				now := time.Now()
				if !now.Before(shut) {
					break
				}
				if !now.Before(open) {
					a++
					e += int64(answerEvents(body))
					n += int64(len(body))
				}
				if next, ok := answerCursor(body); ok {
					cursor = next
				}
			}
			answers.Add(a)
			events.Add(e)
			nbytes.Add(n)
		}()
	}
	// Server CPU over the window.
	var cpu0, cpu1 procStats
	var statErr error
	sleepUntil(ctx, open)
	cpu0, statErr = srv.stats(ctx, false)
	if dir := os.Getenv(profileEnv); dir != "" {
		out := filepath.Join(dir, fmt.Sprintf("poll-%s.pprof", name))
		go srv.ctl(ctx, "/ctl/profile?dur="+x.PollDur.String()+"&out="+url.QueryEscape(out), nil)
	}
	sleepUntil(ctx, shut)
	if statErr == nil {
		cpu1, statErr = srv.stats(ctx, false)
	}
	wg.Wait()
	if e, _ := firstErr.Load().(error); e != nil {
		out.err = e
		return out
	}
	if statErr != nil {
		out.err = statErr
		return out
	}
	out.answers, out.events, out.bytes = answers.Load(), events.Load(), nbytes.Load()
	out.secs = x.PollDur.Seconds()
	out.cpu = time.Duration(cpu1.CPUNanos - cpu0.CPUNanos)
	return out
}

func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}
