package server

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// capListener closes at once every connection accepted beyond max open
// ones: a client sees the connection end unanswered, as when a server is
// gone, and an EventSource or the Go client retries. Waiting in Accept
// instead would leave a new client hanging until a long-lived stream ends.
type capListener struct {
	net.Listener
	slots chan struct{} // one token per open connection
}

func limitListener(ln net.Listener, max int) net.Listener {
	if max <= 0 {
		return ln
	}
	return &capListener{Listener: ln, slots: make(chan struct{}, max)}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			release := sync.OnceFunc(func() { <-l.slots })
			if tc, ok := c.(*net.TCPConn); ok {
				return &capTCPConn{TCPConn: tc, release: release}, nil
			}
			return &capConn{Conn: c, release: release}, nil
		default:
			c.Close()
		}
	}
}

// capTCPConn frees its slot when closed, by net/http or, for a detached
// stream, by the hub; the *net.TCPConn it embeds keeps the methods they
// look for (SyscallConn, CloseWrite, ReadFrom).
type capTCPConn struct {
	*net.TCPConn
	release func()
}

func (c *capTCPConn) Close() error {
	err := c.TCPConn.Close()
	c.release()
	return err
}

// capConn is capTCPConn for a listener of another kind.
type capConn struct {
	net.Conn
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// SyscallConn lets a detached stream watch the connection, as it does a
// bare one.
func (c *capConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// bodyDeadline bounds the reading of a request's body, on every path, to
// d from the moment its handler starts: a client dripping its body gets a
// read error then (os.ErrDeadlineExceeded; POST /publish answers 408), and
// the connection is closed, also when the handler reads none of it and
// net/http reads it afterwards to reuse the connection. Once the body is
// read whole the deadline is lifted, so that net/http's check for a
// vanished client, which reads the connection while the handler runs,
// cannot end the request's context in the middle of an append. A request
// without a body (every stream and poll an EventSource or the browser
// module sends) gets no deadline: that check starts at once for it, and a
// deadline would end the stream.
func bodyDeadline(d time.Duration, next http.Handler) http.Handler {
	if d <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts the connection's read deadline at the body's end.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
