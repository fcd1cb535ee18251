package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// node is one upstream: it answers every request with its name, the path
// and Host it saw and the body it read; /sse writes one event, flushes, and
// the next only once release is closed; /longpoll signals held and
// answers only once release is closed. It records when a request's context ended.
type node struct {
	name     string
	srv      *httptest.Server
	release  chan struct{}
	held     chan struct{} // a /longpoll request arrived
	mu       sync.Mutex
	canceled int
}

func newNode(t *testing.T, name string) *node {
	n := &node{name: name, release: make(chan struct{}), held: make(chan struct{}, 10)}
	n.srv = httptest.NewServer(http.HandlerFunc(n.serve))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *node) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch r.URL.Path {
	case "/sse":
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: data\ndata: first from %s\n\n", n.name)
		w.(http.Flusher).Flush()
		select {
		case <-n.release:
			fmt.Fprintf(w, "event: data\ndata: second from %s\n\n", n.name)
		case <-r.Context().Done():
			n.mu.Lock()
			n.canceled++
			n.mu.Unlock()
		}
		return
	case "/longpoll":
		n.held <- struct{}{}
		select {
		case <-n.release:
		case <-r.Context().Done():
			n.mu.Lock()
			n.canceled++
			n.mu.Unlock()
			return
		}
	}
	w.Header().Set("Location", "http://"+r.Host+r.URL.Path)
	fmt.Fprintf(w, "%s %s %s %s %q", n.name, r.Method, r.URL.RequestURI(), r.Host, body)
}

func (n *node) canceledCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.canceled
}

func startProxy(t *testing.T, nodes ...*node) *httptest.Server {
	t.Helper()
	var ups []string
	for _, n := range nodes {
		ups = append(ups, n.srv.URL)
	}
	us, err := parseUpstreams(ups)
	if err != nil {
		t.Fatal(err)
	}
	p := httptest.NewServer(newProxy(us, log.New(io.Discard, "", 0)))
	t.Cleanup(p.Close)
	return p
}

func get(t *testing.T, method, u, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestAlternates(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	p := startProxy(t, a, b)
	host := strings.TrimPrefix(p.URL, "http://")
	for i := range 6 {
		want := []string{"a", "b"}[i%2]
		method, body := "GET", ""
		if i%3 == 0 {
			method, body = "POST", fmt.Sprintf("body %d", i)
		}
		resp, got := get(t, method, fmt.Sprintf("%s/v1/stream/s?offset=%d", p.URL, i), body)
		wantBody := fmt.Sprintf("%s %s /v1/stream/s?offset=%d %s %q", want, method, i, host, body)
		if resp.StatusCode != 200 || got != wantBody {
			t.Fatalf("request %d: %d %q, want 200 %q", i, resp.StatusCode, got, wantBody)
		}
		// The upstream saw the proxy's Host, so the URLs it builds name the proxy.
		if loc := resp.Header.Get("Location"); loc != p.URL+"/v1/stream/s" {
			t.Fatalf("request %d: Location %q, want %q", i, loc, p.URL+"/v1/stream/s")
		}
	}
}

func TestAlternatesUnderConcurrency(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	p := startProxy(t, a, b)
	const n = 40
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, got := get(t, "GET", p.URL+"/x", "")
			mu.Lock()
			counts[strings.Fields(got)[0]]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if counts["a"] != n/2 || counts["b"] != n/2 {
		t.Fatalf("requests per upstream %v, want %d each", counts, n/2)
	}
}

// An SSE answer's first event reaches the client while the upstream is
// still writing, and a client that leaves cancels the upstream request.
func TestStreamsFlushThrough(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	p := startProxy(t, a, b)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", p.URL+"/sse", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	readEvent := func() string {
		var ev bytes.Buffer
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("reading the stream: %v (so far %q)", err, ev.String())
			}
			if line == "\n" {
				return ev.String()
			}
			ev.WriteString(line)
		}
	}
	// The upstream has not been released: this event came through unbuffered.
	if ev := readEvent(); ev != "event: data\ndata: first from a\n" {
		t.Fatalf("first event %q", ev)
	}
	close(a.release)
	if ev := readEvent(); ev != "event: data\ndata: second from a\n" {
		t.Fatalf("second event %q", ev)
	}

	// b's stream: the client goes away while the upstream waits.
	ctx2, cancel2 := context.WithCancel(context.Background())
	req2, _ := http.NewRequestWithContext(ctx2, "GET", p.URL+"/sse", nil)
	resp2, err := http.DefaultClient.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp2.Body).ReadString('\n')
	if err != nil || line != "event: data\n" {
		t.Fatalf("b's stream: %q, %v", line, err)
	}
	cancel2()
	resp2.Body.Close()
	waitFor(t, func() bool { return b.canceledCount() == 1 }, "b's upstream request to be canceled")
}

// A long poll held by the upstream is answered through the proxy once the
// upstream answers, while the next requests go on alternating.
func TestLongPoll(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	p := startProxy(t, a, b)
	done := make(chan string, 1)
	go func() {
		_, got := get(t, "GET", p.URL+"/longpoll", "")
		done <- got
	}()
	<-a.held // the poll went to a, and a holds it
	if _, got := get(t, "GET", p.URL+"/other", ""); !strings.HasPrefix(got, "b GET /other") {
		t.Fatalf("the request after the poll: %q, want b's answer", got)
	}
	if _, got := get(t, "GET", p.URL+"/other", ""); !strings.HasPrefix(got, "a GET /other") {
		t.Fatalf("the next: %q, want a's answer", got)
	}
	select {
	case got := <-done:
		t.Fatalf("long poll answered before the upstream released it: %q", got)
	case <-time.After(50 * time.Millisecond):
	}
	close(a.release)
	select {
	case got := <-done:
		if !strings.HasPrefix(got, "a GET /longpoll") {
			t.Fatalf("long poll: %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long poll not answered after the upstream released it")
	}
}

func TestUpstreamDown(t *testing.T) {
	a := newNode(t, "a")
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	us, err := parseUpstreams([]string{a.srv.URL, deadURL})
	if err != nil {
		t.Fatal(err)
	}
	p := httptest.NewServer(newProxy(us, log.New(io.Discard, "", 0)))
	defer p.Close()
	if resp, _ := get(t, "GET", p.URL+"/x", ""); resp.StatusCode != 200 {
		t.Fatalf("to a: %d", resp.StatusCode)
	}
	if resp, _ := get(t, "GET", p.URL+"/x", ""); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("to the dead upstream: %d, want 502", resp.StatusCode)
	}
}

func TestParseUpstreams(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"http://127.0.0.1:1"},
		{"http://127.0.0.1:1", "127.0.0.1:2"},
		{"http://127.0.0.1:1", "ftp://127.0.0.1:2"},
		{"http://127.0.0.1:1", "http://"},
	} {
		if _, err := parseUpstreams(args); err == nil {
			t.Errorf("parseUpstreams(%q): no error", args)
		}
	}
	us, err := parseUpstreams([]string{"http://127.0.0.1:1", "https://[::1]:2/base"})
	if err != nil || len(us) != 2 || us[1].Path != "/base" {
		t.Fatalf("parseUpstreams: %v, %v", us, err)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRunRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"http://127.0.0.1:1"},
		{"-nosuchflag", "http://127.0.0.1:1", "http://127.0.0.1:2"},
		{"-listen", "256.0.0.1:0", "http://127.0.0.1:1", "http://127.0.0.1:2"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("run(%q) = %d, want 2 (stderr %q)", args, code, errb.String())
		}
	}
}
