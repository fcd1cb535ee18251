// Command rrproxy is a round-robin HTTP reverse proxy for tests: each
// request goes to the next of its upstreams in turn, so with two replayd
// nodes every request lands on the other node from the one before it (a
// write on one node, the next read on the other). It exists for the Durable
// Streams conformance run against two `replayd serve` nodes on one
// PostgreSQL (see ../README.md).
//
//	rrproxy [-listen 127.0.0.1:0] http://127.0.0.1:8081 http://127.0.0.1:8082
//
// Streaming answers (SSE, long polls, chunked bodies) are flushed to the
// client as each write arrives, and a client that goes away cancels its
// upstream request. The client's Host header is passed on, so URLs an
// upstream builds from it (Location) name the proxy. An upstream that
// cannot be reached gets the client a 502; nothing is retried elsewhere.
// It prints "rrproxy: listening on http://ADDR" on stdout once it accepts
// connections, and stops on SIGINT or SIGTERM. It uses the standard
// library only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rrproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "`address` to listen on")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: rrproxy [-listen ADDR] UPSTREAM_URL UPSTREAM_URL...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ups, err := parseUpstreams(fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "rrproxy: %v\n", err)
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "rrproxy: -listen: %v\n", err)
		return 2
	}
	logger := log.New(stderr, "rrproxy: ", log.LstdFlags)
	srv := &http.Server{
		Handler:           newProxy(ups, logger),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          logger,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		// Streams never end by themselves: give requests a moment, then cut.
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	fmt.Fprintf(stdout, "rrproxy: listening on http://%s\n", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "rrproxy: %v\n", err)
		return 1
	}
	return 0
}

// parseUpstreams checks that each argument is an absolute http or https
// URL, and that there are at least two.
func parseUpstreams(args []string) ([]*url.URL, error) {
	if len(args) < 2 {
		return nil, errors.New("give at least two upstream URLs")
	}
	ups := make([]*url.URL, 0, len(args))
	for _, a := range args {
		u, err := url.Parse(a)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: %v", a, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("upstream %q: not an absolute http(s) URL", a)
		}
		ups = append(ups, u)
	}
	return ups, nil
}

// newProxy returns a handler sending the n-th request it serves (counting
// from 0) to ups[n % len(ups)], each upstream's path prefixed to the
// request's.
func newProxy(ups []*url.URL, logger *log.Logger) http.Handler {
	proxies := make([]*httputil.ReverseProxy, len(ups))
	for i, u := range ups {
		proxies[i] = &httputil.ReverseProxy{
			Rewrite: func(r *httputil.ProxyRequest) {
				r.SetURL(u)
				r.Out.Host = r.In.Host
				r.SetXForwarded()
			},
			FlushInterval: -1, // every write reaches the client at once
			ErrorLog:      logger,
		}
	}
	var next atomic.Uint64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := next.Add(1) - 1
		proxies[n%uint64(len(proxies))].ServeHTTP(w, r)
	})
}
