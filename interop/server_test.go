package interop

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/sseparse"
)

// The server side of the harness: a replayd hub behind a front handler
// that can hold, refuse or end requests on the test's word, and a TCP proxy
// that can cut connections.

// board is a value several goroutines watch: update changes it under the
// lock and wakes every until.
type board struct {
	mu sync.Mutex    // protects ch and what the owner's fields say it does
	ch chan struct{} // closed and replaced on each update
}

func (b *board) update(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f()
	if b.ch != nil {
		close(b.ch)
	}
	b.ch = make(chan struct{})
}

// changed returns a channel closed at the next update.
func (b *board) changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// untilEither reports whether ok became true before ctx ended, testing it
// again on each update of a or b. ok takes the locks it needs.
func untilEither(ctx context.Context, a, b *board, ok func() bool) bool {
	for {
		ca, cb := a.changed(), b.changed()
		if ok() {
			return true
		}
		select {
		case <-ca:
		case <-cb:
		case <-ctx.Done():
			return false
		}
	}
}

// until reports whether ok, called under the lock, became true before ctx
// ended.
func (b *board) until(ctx context.Context, ok func() bool) bool {
	for {
		b.mu.Lock()
		if ok() {
			b.mu.Unlock()
			return true
		}
		if b.ch == nil {
			b.ch = make(chan struct{})
		}
		ch := b.ch
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// request is what the front saw of one request that reached it.
type request struct {
	cursor   string // Last-Event-ID, or else the lastEventId query parameter; "" for none
	answer   string // "503", "stream" (a hello was sent), "overload", "ended"; "" while waiting
	admitted bool   // the hub sent it a hello
}

// blockerHeader marks the harness's own requests, which pass the front
// untouched and unrecorded.
const blockerHeader = "X-Interop-Blocker"

// front stands before the hub. Requests wait while the gate is shut, so
// that events published during an outage are missed by the client; the
// next fail503 requests get a 503 with Retry-After; endStreams ends every
// stream in flight the way the hub's own cuts do (the handler returns and
// the response ends cleanly).
type front struct {
	board
	hub     http.Handler                    // guarded by mu; replaced on restart
	gate    chan struct{}                   // guarded by mu; nil: open, else closed when opened
	fail503 int                             // guarded by mu
	active  map[*request]context.CancelFunc // guarded by mu: requests being served by the hub, and their revocation
	log     []*request                      // guarded by mu: in arrival order
}

func newFront(hub http.Handler) *front {
	return &front{hub: hub, active: map[*request]context.CancelFunc{}}
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	hub := f.hub
	f.mu.Unlock()
	if r.Header.Get(blockerHeader) != "" {
		hub.ServeHTTP(w, r)
		return
	}
	req := &request{cursor: r.Header.Get("Last-Event-ID")} // the header first, as the hub reads it
	if req.cursor == "" {
		req.cursor = r.URL.Query().Get("lastEventId")
	}
	var gate chan struct{}
	f.update(func() {
		f.log = append(f.log, req)
		gate = f.gate
	})
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	var refuse bool
	f.update(func() {
		hub = f.hub
		if refuse = f.fail503 > 0; refuse {
			f.fail503--
			req.answer = "503"
		}
	})
	if refuse {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "service unavailable", http.StatusServiceUnavailable)
		return
	}
	revoked, revoke := context.WithCancel(context.Background())
	defer revoke()
	f.update(func() { f.active[req] = revoke })
	cw := &capture{ResponseWriter: w, onHello: func() {
		f.update(func() { req.admitted, req.answer = true, "stream" })
	}}
	hub.ServeHTTP(cw, r.WithContext(replayd.WithRevocation(r.Context(), revoked)))
	f.update(func() {
		delete(f.active, req)
		switch {
		case req.admitted:
		case bytes.HasPrefix(cw.head, []byte("retry:")):
			req.answer = "overload"
		default:
			req.answer = "ended"
		}
	})
}

func (f *front) shut() { f.update(func() { f.gate = make(chan struct{}) }) }

func (f *front) open() {
	f.update(func() {
		if f.gate != nil {
			close(f.gate)
			f.gate = nil
		}
	})
}

func (f *front) refuseNext(n int) { f.update(func() { f.fail503 = n }) }

func (f *front) setHub(h http.Handler) { f.update(func() { f.hub = h }) }

// revokeAll revokes every stream the hub is serving.
func (f *front) revokeAll() {
	f.update(func() {
		for _, cancel := range f.active {
			cancel()
		}
	})
}

// idle waits until the hub serves no request of the front's.
func (f *front) idle(t *testing.T, ctx context.Context) {
	t.Helper()
	if !f.until(ctx, f.idleLocked) {
		t.Fatal("the hub's handlers did not return")
	}
}

func (f *front) idleLocked() bool { return len(f.active) == 0 }

func (f *front) isIdle() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.idleLocked()
}

// requests returns a copy of the log from index from on.
func (f *front) requests(from int) []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []request
	for _, r := range f.log[min(from, len(f.log)):] {
		out = append(out, *r)
	}
	return out
}

func (f *front) logLen() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.log)
}

// capture keeps the first bytes of a response, enough to tell a stream from
// the overload answer.
type capture struct {
	http.ResponseWriter
	head    []byte
	onHello func() // called once, when the hello has been written
	hello   bool
}

func (c *capture) Write(p []byte) (int, error) {
	if len(c.head) < 512 {
		c.head = append(c.head, p[:min(len(p), 512-len(c.head))]...)
	}
	n, err := c.ResponseWriter.Write(p)
	if !c.hello && bytes.Contains(c.head, []byte("event: hello")) {
		c.hello = true
		c.onHello()
	}
	return n, err
}

func (c *capture) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// site is a hub on a SQLite file, behind a front, served over HTTP.
type site struct {
	t     *testing.T
	path  string
	opts  replayd.Options
	hub   *replayd.EventHub
	db    interface{ Close() error }
	front *front
	srv   *httptest.Server

	hubClosed bool
	published []int64 // sequences of the events published, in order
}

func newSite(t *testing.T, opts replayd.Options) *site {
	s := &site{t: t, path: filepath.Join(t.TempDir(), "events.db"), opts: opts}
	s.openHub()
	s.front = newFront(s.hub.Handler())
	s.srv = httptest.NewServer(s.front)
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		s.closeHub()
		s.srv.Close()
	})
	return s
}

func (s *site) openHub() {
	s.t.Helper()
	db, err := replayd.OpenDB(s.path)
	if err != nil {
		s.t.Fatal(err)
	}
	h, err := replayd.New(db, s.opts)
	if err != nil {
		db.Close()
		s.t.Fatal(err)
	}
	s.hub, s.db, s.hubClosed = h, db, false
}

// closeHub closes the hub and its database, once.
func (s *site) closeHub() {
	if s.hubClosed {
		return
	}
	s.hubClosed = true
	if err := s.hub.Close(); err != nil {
		s.t.Error(err)
	}
	if err := s.db.Close(); err != nil {
		s.t.Error(err)
	}
}

// publish publishes n small events on topic t.
func (s *site) publish(ctx context.Context, n int) {
	s.t.Helper()
	for range n {
		s.publishOne(ctx, map[string]int{"n": len(s.published) + 1})
	}
}

func (s *site) publishOne(ctx context.Context, payload any) {
	s.t.Helper()
	ev, err := s.hub.Publish(ctx, "t", payload)
	if err != nil {
		s.t.Fatal(err)
	}
	s.published = append(s.published, ev.Sequence)
}

// bigPayload is well under the 64 KiB a Go client's scanner takes by
// default, and large enough to fill socket buffers quickly.
var bigPayload = strings.Repeat("x", 16<<10)

// publishUntilCut publishes 16 KiB events until the hub has cut the
// client's stream (SSEOptions.MaxBufferedBytes): the client must not be
// reading.
func (s *site) publishUntilCut(ctx context.Context) {
	s.t.Helper()
	for i := 0; !s.front.isIdle(); i++ {
		if i == 5000 || ctx.Err() != nil {
			s.t.Fatalf("the hub did not cut the stream after %d events of 16 KiB", i)
		}
		s.publishOne(ctx, map[string]any{"n": len(s.published) + 1, "pad": bigPayload})
	}
}

// stop stops the server as a process does on shutdown (net/http's
// Shutdown order: the listener first, then the hub, which ends every
// stream), keeping its address for start.
func (s *site) stop(ctx context.Context) {
	s.t.Helper()
	s.srv.Listener.Close()
	s.closeHub()
	s.front.idle(s.t, ctx)
	s.srv.Close()
}

// start opens a new hub on the same file, runs publish on it while the
// server is down, and serves again on the same address once outage has
// passed since the call.
func (s *site) start(ctx context.Context, outage time.Duration, publish func()) {
	s.t.Helper()
	down := time.NewTimer(outage)
	defer down.Stop()
	addr := s.srv.Listener.Addr().String()
	s.openHub()
	s.front.setHub(s.hub.Handler())
	publish()
	select {
	case <-down.C:
	case <-ctx.Done():
		s.t.Fatal("start: out of time")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.srv = httptest.NewUnstartedServer(s.front)
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Start()
}

// block takes a connection slot of the hub's (SSEOptions.MaxConnections)
// and holds it until the returned function is called.
func (s *site) block(ctx context.Context) (release func()) {
	s.t.Helper()
	bctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(bctx, http.MethodGet, s.srv.URL+"/?topic=blocker", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set(blockerHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		s.t.Fatal(err)
	}
	f, err := sseparse.NewReader(resp.Body).Next()
	if err != nil || string(f.Event) != "hello" {
		cancel()
		resp.Body.Close()
		s.t.Fatalf("blocker: not admitted: %v", err)
	}
	return func() {
		cancel()
		resp.Body.Close()
	}
}

// proxy forwards TCP connections to a backend and can cut them all at
// once, with a reset, as a failing network does.
type proxy struct {
	ln      net.Listener
	backend string
	wg      sync.WaitGroup
	mu      sync.Mutex            // protects conns and paused
	conns   map[net.Conn]net.Conn // client side -> backend side
	paused  chan struct{}         // non-nil while paused; closed by resume
}

func newProxy(t *testing.T, backend string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, backend: backend, conns: map[net.Conn]net.Conn{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = b
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, b, c, true)
		go p.pipe(b, c, c, false)
	}
}

// pipe copies src to dst, holding the data while the proxy is paused if
// pausable; the pair keyed by client is closed when either direction ends.
func (p *proxy) pipe(dst, src, client net.Conn, pausable bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if pausable {
			p.mu.Lock()
			paused := p.paused
			p.mu.Unlock()
			if paused != nil {
				<-paused
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil { // a reset or a closed peer: the pair is closed below either way
			break
		}
	}
	p.mu.Lock()
	b, ok := p.conns[client]
	delete(p.conns, client)
	p.mu.Unlock()
	if ok {
		client.Close()
		b.Close()
	}
}

// pause stops forwarding what the server sends, as a client that does not
// read would; resume lets it go on.
func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
}

func (p *proxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
}

// cut resets every connection in flight.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, b := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close with RST, not FIN
		}
		c.Close()
		b.Close()
		delete(p.conns, c)
	}
}

func (p *proxy) close() {
	p.resume()
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}
