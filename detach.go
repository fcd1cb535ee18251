package replayd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// A detached stream (SSEOptions.DetachConnections) runs on the HTTP/1.1
// connection taken over from net/http: the handler returns at once, so
// net/http's serving goroutine, its background read and its buffers go.
// The stream lives on as the socket, the stream's own state and one
// goroutine (serveDetached) on a small stack. It writes through
// connWriter, a ResponseWriter over the bare connection, so the stream's
// queue, deadline and kill logic are the same on both paths.

// detach is a stream's detach step (SSEOptions.DetachConnections): it
// takes the stream's HTTP/1.1 connection off net/http and starts
// serveDetached, which runs the stream's remaining steps on a goroutine of
// its own once the handler returned. false leaves the stream on its
// handler: HTTP/2, a ResponseWriter that cannot flush (open refuses it) or
// cannot hijack, and a closed hub (open refuses it too) are served there.
//
//go:noinline
func (c *sseStream) detach(r *http.Request) bool {
	h := c.h
	if !h.opts.SSE.DetachConnections || r.ProtoMajor != 1 || !canFlush(c.w) {
		return false
	}
	// Close waits for the goroutine below as for any stream.
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return false
	}
	h.wg.Add(1)
	h.mu.Unlock()
	conn, _, err := http.NewResponseController(c.w).Hijack()
	if err != nil {
		h.wg.Done()
		return false
	}
	// The bufio.ReadWriter is dropped: nothing more is read from the
	// connection (the response ends with it), and its buffers go with the
	// rest of net/http's per-connection state.
	cw := newConnWriter(conn, c.w.Header())
	// The request's context ends when this handler returns; the stream's
	// ends with the stream (end cancels it). Its values are kept. The
	// request is not: what the stream needs of it was read at admission,
	// and a browser's headers (cookies included) can weigh more than the
	// rest of the stream. A revocation the request carries is watched
	// from open on (watchRevocation).
	ctx := newStreamCtx(r.Context())
	// The client's leaving cancels it, as net/http's background read does
	// (Linux); elsewhere the stream sees it at its next write.
	if cw.raw != nil {
		if unwatch, ok := watchDeparture(cw.raw, ctx.cancel); ok {
			cw.unwatch, cw.checkAtWrite = unwatch, false
		}
	}
	c.w, c.cw, c.ctx, c.cancel = cw, cw, ctx, ctx.cancel
	if testHookDetached != nil {
		testHookDetached()
	}
	go c.serveDetached()
	return true
}

// serveDetached is a detached stream's goroutine: it runs the steps that
// follow detach as sseHandler.ServeHTTP does on a handler (open, live,
// end), waiting in liveLoop called from here, so that an idle stream's
// stack holds only this frame, liveLoop's and a channel receive's: it
// settles at 4 KiB (8 KiB when the loop ran under the frame that opened
// the stream, as it once did). A panic (a HeartbeatData function's, say)
// ends only this stream, logged by end (closeDetached), as net/http does
// for a handler's.
func (c *sseStream) serveDetached() {
	defer func() { c.end(recover()) }()
	if c.open() {
		c.liveLoop()
	}
}

// closeDetached closes a detached stream's connection, at its end. A panic
// p that ended the stream, if not nil, is logged.
func (c *sseStream) closeDetached(p any) {
	cw := c.cw
	if p != nil {
		buf := make([]byte, 64<<10)
		buf = buf[:runtime.Stack(buf, false)]
		c.h.logger.Error("replayd: panic serving a detached stream", "remote", c.remote, "panic", fmt.Sprint(p), "stack", string(buf))
	} else if !cw.head {
		// It ended before its first write (its client left during the
		// handshake; a revoked one writes why): the head still goes, as
		// net/http sends one for a handler that returns without writing
		// (not for one that panics), so a client still there sees an
		// empty response end, not a broken one.
		_ = cw.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_ = cw.FlushError()
	}
	cw.close()
}

// testHookDetached, if set, is called for each stream that detaches.
var testHookDetached func()

// connWriter is an http.ResponseWriter over a hijacked HTTP/1.1
// connection. The response has no Content-Length and no chunked encoding:
// it is delimited by the connection's end (Connection: close), which every
// HTTP/1.x client and proxy reads (RFC 9112 §6.3), and which costs nothing
// per write. Writes go to the socket at once; there is no buffer to flush.
//
// It is used by one goroutine, except SetWriteDeadline, which the stream's
// Kill (live.Stream) calls from any goroutine (net.Conn allows that).
type connWriter struct {
	conn         net.Conn
	raw          syscall.RawConn // the socket under conn; nil if unknown
	checkAtWrite bool            // look for the client's end before a write after a silence
	unwatch      func()          // ends the departure watch; nil: none
	header       http.Header     // until the head is written
	status       int
	head         bool      // the status line and headers were written
	idle         time.Time // when the last write ended
}

func newConnWriter(conn net.Conn, header http.Header) *connWriter {
	cw := &connWriter{conn: conn, header: header, status: http.StatusOK}
	nc := conn
	if tc, ok := conn.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			cw.raw, cw.checkAtWrite = raw, departureCheck
		}
	}
	return cw
}

func (cw *connWriter) Header() http.Header {
	if cw.header == nil {
		cw.header = http.Header{} // written already: changes are lost, as with net/http
	}
	return cw.header
}

func (cw *connWriter) WriteHeader(code int) {
	if !cw.head {
		cw.status = code
	}
}

// departureIdle is how long a connection must have been silent before a
// write first checks whether the client left.
const departureIdle = time.Second

func (cw *connWriter) Write(b []byte) (int, error) {
	if !cw.head {
		return cw.writeHead(b)
	}
	// A client that left is seen by the write after the one its FIN
	// answered; a stream that only gets heartbeats would be held a whole
	// interval more. So a write after a silence first looks, without
	// blocking, for the client's end of the connection.
	if cw.checkAtWrite && time.Since(cw.idle) >= departureIdle && cw.clientGone() {
		return 0, errClientGone
	}
	n, err := cw.conn.Write(b)
	cw.idle = time.Now()
	return n, err
}

var errClientGone = errors.New("replayd: the client closed the connection")

// writeHead writes the status line, the headers and b in one write.
func (cw *connWriter) writeHead(b []byte) (int, error) {
	bp := bufPool.Get().(*[]byte)
	buf := (*bp)[:0]
	buf = append(buf, "HTTP/1.1 "...)
	buf = strconv.AppendInt(buf, int64(cw.status), 10)
	buf = append(buf, ' ')
	buf = append(buf, http.StatusText(cw.status)...)
	buf = append(buf, "\r\n"...)
	cw.header.Del("Content-Length")
	cw.header.Del("Transfer-Encoding")
	cw.header.Set("Connection", "close")
	if cw.header.Get("Date") == "" {
		cw.header.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	hw := appendWriter{buf}
	_ = cw.header.Write(&hw)
	buf = append(hw.b, "\r\n"...)
	n := len(buf)
	buf = append(buf, b...)
	cw.head, cw.header = true, nil
	m, err := cw.conn.Write(buf)
	cw.idle = time.Now()
	if cap(buf) <= 64<<10 {
		*bp = buf[:0]
		bufPool.Put(bp)
	}
	return max(m-n, 0), err
}

type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// FlushError writes the head if nothing was written yet; writes are not
// buffered otherwise.
func (cw *connWriter) FlushError() error {
	if !cw.head {
		_, err := cw.writeHead(nil)
		return err
	}
	return nil
}

func (cw *connWriter) SetWriteDeadline(t time.Time) error { return cw.conn.SetWriteDeadline(t) }

// close ends the response by closing the connection. A TLS connection is
// closed under its TLS layer, without close_notify: that alert is a write
// that can wait up to 5s on a client that stopped reading, and the stream
// ends either way (an EventSource reconnects).
func (cw *connWriter) close() {
	if cw.unwatch != nil {
		cw.unwatch()
	}
	if tc, ok := cw.conn.(*tls.Conn); ok {
		_ = tc.NetConn().Close()
		return
	}
	_ = cw.conn.Close()
}

// streamCtx is a detached stream's context: the request's values, done
// when the stream ends or its client leaves. It is lighter than
// context.WithCancel under a stream held for hours: a context derived from
// it (a log read's) registers through AfterFunc, and leaves nothing behind
// once done, where a cancelCtx keeps the map it once needed.
type streamCtx struct {
	values context.Context // the request's context, for Value only

	mu    sync.Mutex
	done  chan struct{}
	err   error
	after []*func() // registered by AfterFunc; nil entries were stopped
}

func newStreamCtx(r context.Context) *streamCtx {
	return &streamCtx{values: r, done: make(chan struct{})}
}

func (c *streamCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *streamCtx) Done() <-chan struct{}       { return c.done }
func (c *streamCtx) Value(key any) any           { return c.values.Value(key) }

func (c *streamCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// cancel ends the context, once, and runs the functions registered.
func (c *streamCtx) cancel() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.Canceled
	close(c.done)
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for _, f := range after {
		if f != nil {
			go (*f)()
		}
	}
}

// AfterFunc is what the context package uses to tie a derived context to
// this one (as context.AfterFunc does for its own): f runs on a goroutine
// of its own once c is done, unless stop was called first.
func (c *streamCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	p := &f
	c.after = append(c.after, p)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, q := range c.after {
			if q == p {
				c.after = append(c.after[:i], c.after[i+1:]...)
				if len(c.after) == 0 {
					c.after = nil
				}
				return true
			}
		}
		return false
	}
}
