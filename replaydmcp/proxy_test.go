package replaydmcp

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// proxy stands between the MCP client and the server processes, as a load
// balancer would: it forwards each request to the current upstream (which
// the test may switch, or restart), streams event-stream responses event
// by event, and, while frozen, drops the events instead of forwarding
// them, so that the client misses what the server sent meanwhile. A
// request it cannot forward (the server is down) gets its connection
// closed, as a dead server's would be.
type proxy struct {
	*httptest.Server
	transport *http.Transport

	mu       sync.Mutex
	upstream string
	frozen   bool
	dropped  int
	progress int // progress notifications forwarded
	freezeAt int // freeze once this many are forwarded; 0: never
	cancels  map[*http.Request]func()
	served   map[string]int // requests forwarded, by "METHOD upstream"
}

func newProxy(t *testing.T, upstream string) *proxy {
	p := &proxy{transport: &http.Transport{}, upstream: upstream, cancels: map[*http.Request]func(){}, served: map[string]int{}}
	p.Server = httptest.NewServer(p)
	t.Cleanup(func() {
		p.Server.CloseClientConnections()
		p.Server.Close()
		p.transport.CloseIdleConnections()
	})
	return p
}

// thaw forwards events again (see freezeAfter).
func (p *proxy) thaw() { p.mu.Lock(); p.frozen = false; p.mu.Unlock() }

// freezeAfter makes the proxy freeze itself once it has forwarded n
// progress notifications: the client has exactly those.
func (p *proxy) freezeAfter(n int) { p.mu.Lock(); p.freezeAt = n; p.mu.Unlock() }

// cut ends the responses in flight to requests of method: their clients
// reconnect.
func (p *proxy) cut(method string) {
	p.mu.Lock()
	var cancels []func()
	for r, c := range p.cancels {
		if r.Method == method {
			cancels = append(cancels, c)
			delete(p.cancels, r)
		}
	}
	p.mu.Unlock()
	for _, c := range cancels {
		c()
	}
}

// servedBy returns how many requests of method went to upstream.
func (p *proxy) servedBy(method, upstream string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served[method+" "+upstream]
}

// switchTo sends the next requests to upstream, and ends the responses
// in flight from the previous one (their clients reconnect).
func (p *proxy) switchTo(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	cancels := p.cancels
	p.cancels = map[*http.Request]func(){}
	p.mu.Unlock()
	for _, c := range cancels {
		c()
	}
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	up := p.upstream
	p.served[r.Method+" "+up]++
	p.mu.Unlock()
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = "http", strings.TrimPrefix(up, "http://")
	out.Host = out.URL.Host
	ctx, cancel := context.WithCancel(r.Context())
	out = out.WithContext(ctx)
	p.mu.Lock()
	p.cancels[r] = cancel
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.cancels, r)
		p.mu.Unlock()
		cancel()
	}()
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			w.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}
	br := bufio.NewReader(resp.Body)
	var ev bytes.Buffer
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return // the server ended the stream or died: end it cleanly
		}
		ev.Write(line)
		if len(bytes.TrimRight(line, "\r\n")) > 0 {
			continue
		}
		p.mu.Lock()
		frozen := p.frozen
		if frozen {
			p.dropped++
		}
		p.mu.Unlock()
		if !frozen {
			w.Write(ev.Bytes())
			rc.Flush()
			if bytes.Contains(ev.Bytes(), []byte(`"notifications/progress"`)) {
				p.mu.Lock()
				p.progress++
				if p.progress == p.freezeAt {
					p.frozen = true
				}
				p.mu.Unlock()
			}
		}
		ev.Reset()
	}
}
