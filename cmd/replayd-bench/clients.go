package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/internal/sseparse"
)

// The client side: a fleet of SSE connections in the orchestrator's
// process. Each is a bare TCP connection with a hand-written GET (no
// http.Transport goroutines), net/http's response and chunked-body reader,
// and a frame scanner that counts event frames, remembers the last id, and
// reads the publish time stamped in the payload to measure latency, with
// the repository's one SSE parser (internal/sseparse).

// fleet is a set of SSE clients and what they have received.
type fleet struct {
	clients []*client
	wg      sync.WaitGroup

	recording atomic.Bool // record latencies into hist
	hists     [16]histogram

	mu        sync.Mutex // guards remaining and reached
	remaining int        // clients that have not reached their target
	reached   chan struct{}
}

type client struct {
	f      *fleet
	idx    int
	conn   net.Conn
	body   io.ReadCloser
	helloc chan struct{} // closed when the hello frame arrives

	cursor    atomic.Int64 // the hello's id
	lastID    atomic.Int64
	got       atomic.Int64 // event frames since the target was set
	target    atomic.Int64 // 0: no target
	reachedAt atomic.Int64 // unix ns when got reached target
	gaps      atomic.Int64
	err       atomic.Value // error that ended the stream, if any
}

// dialFleet opens n streams at addr, at most parallel handshakes at a time
// (0: all at once), and waits for every hello. path gives client i's
// request path and query; lastID gives its Last-Event-ID header ("" none).
// target > 0 sets each client's target from the start (see expect).
func dialFleet(ctx context.Context, addr string, n, parallel int, path func(i int) string, lastID func(i int) string, target int64) (*fleet, error) {
	f := &fleet{clients: make([]*client, n), remaining: n, reached: make(chan struct{})}
	sem := make(chan struct{}, max(parallel, 1))
	if parallel <= 0 {
		sem = make(chan struct{}, n+1)
	}
	errc := make(chan error, n)
	var dialing sync.WaitGroup
	for i := range n {
		c := &client{f: f, idx: i, helloc: make(chan struct{})}
		c.target.Store(target)
		f.clients[i] = c
		dialing.Add(1)
		go func() {
			defer dialing.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
			defer func() { <-sem }()
			var hdr string
			if lastID != nil {
				hdr = lastID(i)
			}
			if err := c.dial(ctx, addr, path(i), hdr); err != nil {
				errc <- err
				return
			}
			select {
			case <-c.helloc:
			case <-ctx.Done():
				errc <- fmt.Errorf("client %d: no hello: %w", i, ctx.Err())
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

func (c *client) dial(ctx context.Context, addr, path, lastID string) error {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nAccept: text/event-stream\r\n"
	if lastID != "" {
		req += "Last-Event-ID: " + lastID + "\r\n"
	}
	req += "\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		conn.Close()
		return err
	}
	br := bufio.NewReaderSize(conn, 8<<10)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet, URL: &url.URL{Path: path}})
	if err != nil {
		conn.Close()
		return err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		conn.Close()
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	c.conn, c.body = conn, resp.Body
	c.f.wg.Add(1)
	go c.read()
	return nil
}

var stampPrefix = []byte(`{"t":`)

// read parses frames, with the shared parser, until the stream ends.
func (c *client) read() {
	defer c.f.wg.Done()
	defer c.body.Close()
	b := &clientBody{c: c}
	r := sseparse.NewReaderSize(b, 16<<10)
	helloSeen := false
	for {
		fr, err := r.Next()
		if err != nil {
			b.flush()
			c.err.Store(err)
			return
		}
		var id int64 = -1
		if fr.HasID {
			id, _ = strconv.ParseInt(string(fr.ID), 10, 64)
		}
		switch {
		case string(fr.Event) == "hello":
			c.cursor.Store(id)
			c.lastID.Store(id)
			if !helloSeen {
				helloSeen = true
				close(c.helloc)
			}
		case string(fr.Event) == "gap":
			b.gaps++
		case id >= 0:
			b.events++
			b.last = id
			if b.recording {
				if rest, ok := bytes.CutPrefix(fr.Data, stampPrefix); ok {
					j := 0
					for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
						j++
					}
					if t, err := strconv.ParseInt(string(rest[:j]), 10, 64); err == nil && b.now > t {
						b.lat = append(b.lat, uint64(b.now-t)/1000)
					}
				}
			}
		}
	}
}

// clientBody is a client's response body as read sees it: what read
// counted from one Read's bytes is published (flush) before the next Read,
// which may block, and a frame's latency is measured from the time the
// Read that completed it returned.
type clientBody struct {
	c         *client
	now       int64 // unix ns when the last Read returned
	recording bool  // the fleet recorded latencies then
	events    int64 // event frames since the last flush
	gaps      int64
	last      int64 // the last event id counted, if events > 0
	lat       []uint64
}

func (b *clientBody) Read(p []byte) (int, error) {
	b.flush()
	n, err := b.c.body.Read(p)
	b.now, b.recording = time.Now().UnixNano(), b.c.f.recording.Load()
	return n, err
}

// flush publishes the counts of the frames read since the last flush.
func (b *clientBody) flush() {
	c := b.c
	if b.gaps > 0 {
		c.gaps.Add(b.gaps)
		b.gaps = 0
	}
	if b.events > 0 {
		c.lastID.Store(b.last)
		got := c.got.Add(b.events)
		if t := c.target.Load(); t > 0 && got >= t && c.reachedAt.CompareAndSwap(0, b.now) {
			c.f.oneReached()
		}
		b.events = 0
	}
	if len(b.lat) > 0 {
		c.f.hists[c.idx%len(c.f.hists)].addAll(b.lat)
		b.lat = b.lat[:0]
	}
}

// expect resets every client's count and sets its target: the number of
// event frames it must receive. It returns a channel closed when all have.
func (f *fleet) expect(n int64) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remaining = len(f.clients)
	f.reached = make(chan struct{})
	for _, c := range f.clients {
		c.target.Store(0)
		c.got.Store(0)
		c.reachedAt.Store(0)
		c.target.Store(n)
	}
	if n <= 0 || f.remaining == 0 {
		close(f.reached)
	}
	return f.reached
}

func (f *fleet) oneReached() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remaining--
	if f.remaining == 0 {
		close(f.reached)
	}
}

// done is closed when every client has reached its target.
func (f *fleet) done() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reached
}

// lastReached is the latest time a client reached its target, unix ns.
func (f *fleet) lastReached() int64 {
	var t int64
	for _, c := range f.clients {
		t = max(t, c.reachedAt.Load())
	}
	return t
}

// progress sums event frames received since expect, the clients still
// short of their target, and the streams that ended.
func (f *fleet) progress() (frames int64, short, ended int) {
	for _, c := range f.clients {
		frames += c.got.Load()
		if c.reachedAt.Load() == 0 {
			short++
		}
		if c.err.Load() != nil {
			ended++
		}
	}
	return frames, short, ended
}

func (f *fleet) gaps() int64 {
	var n int64
	for _, c := range f.clients {
		n += c.gaps.Load()
	}
	return n
}

// latency merges the recorded latencies.
func (f *fleet) latency() *histogram {
	h := &histogram{}
	for i := range f.hists {
		h.merge(&f.hists[i])
	}
	return h
}

// close drops every connection and waits for the readers.
func (f *fleet) close() {
	for _, c := range f.clients {
		if c != nil && c.conn != nil {
			c.conn.Close()
		}
	}
	f.wg.Wait()
}
