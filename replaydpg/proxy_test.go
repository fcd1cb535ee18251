package replaydpg

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// testProxy forwards connections to the server of a DSN, counts the bytes
// the server sends back, and can cut every connection open through it.
type testProxy struct {
	dsn      string       // a DSN that goes through the proxy
	received atomic.Int64 // bytes the server sent so far
	down     atomic.Bool  // refuse connections: close each as it is accepted

	mu    sync.Mutex
	conns []net.Conn // both ends of every connection not cut yet
}

// newTestProxy starts a proxy to the server of dsn. It stops when the test
// ends (start it before the stores that use it, so that they close first).
func newTestProxy(t testing.TB, dsn string) *testProxy {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{}
	var (
		ln     net.Listener
		target string
	)
	network := "tcp"
	if filepath.IsAbs(cfg.Host) {
		// A unix socket: host is its directory, the file is named after the port.
		network = "unix"
		target = filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
		dir, err := os.MkdirTemp("", "rdpx")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		ln, err = net.Listen("unix", filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", cfg.Port)))
		if err != nil {
			t.Fatal(err)
		}
		p.dsn = withDSNParam(dsn, "host", dir)
	} else {
		target = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		p.dsn = withDSNParam(withDSNParam(dsn, "host", "127.0.0.1"), "port", strconv.Itoa(port))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			if p.down.Load() {
				client.Close()
				continue
			}
			server, err := net.Dial(network, target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				io.Copy(server, client)
				server.Close()
			}()
			go func() {
				defer wg.Done()
				io.Copy(countingWriter{client, &p.received}, server)
				client.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		wg.Wait()
	})
	return p
}

// cut closes both ends of every connection open through the proxy, as a
// network fault would, and returns how many it cut. What the proxy had
// forwarded before stays forwarded; new connections are accepted as
// before.
func (p *testProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}

// countingProxy starts a testProxy to the server of dsn and returns the
// DSN that goes through it and its count of bytes received.
func countingProxy(t testing.TB, dsn string) (string, *atomic.Int64) {
	t.Helper()
	p := newTestProxy(t, dsn)
	return p.dsn, &p.received
}

// countingWriter adds what it writes to n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(int64(k))
	return k, err
}
