package wiretest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Do sends a request with the given method and headers through client and
// returns the answer with its body read whole; it fails the test on a
// transport error or an answer that does not end within timeout.
func Do(t testing.TB, client *http.Client, method, u string, header http.Header, timeout time.Duration) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: status %d, read the body: %v", method, u, resp.StatusCode, err)
	}
	return resp, body
}

// Get sends a GET and returns its status and body, read whole: it fails
// the test on a transport error or an answer that does not end within
// WaitFor (a stream served where a refusal was due).
func Get(t testing.TB, u string, header http.Header) (int, string) {
	t.Helper()
	resp, body := Do(t, http.DefaultClient, http.MethodGet, u, header, WaitFor)
	return resp.StatusCode, string(body)
}

// GetReady asks a hub's ReadyHandler over real HTTP and returns status and
// body.
func GetReady(t testing.TB, ready http.Handler) (int, string) {
	t.Helper()
	srv := httptest.NewServer(ready)
	defer srv.Close()
	return Get(t, srv.URL, nil)
}

// ReadyWithin calls a hub's Ready with a deadline d away and returns how
// long it took and what it answered.
func ReadyWithin(ready func(context.Context) error, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := ready(ctx)
	return time.Since(start), err
}

// PollPageBytes is the payload, in bytes, at which the hub cuts a poll
// answer (replayd's PollOptions doc): no further event once those before
// it hold this many; more is then true.
const PollPageBytes = 4 << 20

// PollAnswer is a poll answer as a client decodes it.
type PollAnswer struct {
	Topics []string `json:"topics"`
	Cursor int64    `json:"cursor"`
	Head   int64    `json:"head"`
	More   bool     `json:"more"`
	Gap    *Gap     `json:"gap"`
	Events []struct {
		ID    int64           `json:"id"`
		Type  string          `json:"type"`
		Topic *string         `json:"topic"`
		Data  json.RawMessage `json:"data"`
	} `json:"events"`
}

// IDs returns the ids of p's events.
func (p PollAnswer) IDs() []int64 {
	var ids []int64
	for _, ev := range p.Events {
		ids = append(ids, ev.ID)
	}
	return ids
}

// ServePoll starts a real HTTP server, closed at the end of the test, with
// h's SSE endpoint at /events and its poll endpoint at /poll, and returns
// its URL.
func ServePoll(t testing.TB, h interface {
	Handler() http.Handler
	PollHandler() http.Handler
}) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/events", h.Handler())
	mux.Handle("/poll", h.PollHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// GetPoll sends one poll request to base's /poll and returns its status,
// headers and body.
func GetPoll(t testing.TB, base, query string) (int, http.Header, []byte) {
	t.Helper()
	resp, body := Do(t, http.DefaultClient, http.MethodGet, base+"/poll?"+query, nil, 2*WaitFor)
	return resp.StatusCode, resp.Header, body
}

// Poll sends one poll request that must be answered 200 and decodes it.
func Poll(t testing.TB, base, query string) PollAnswer {
	t.Helper()
	status, _, body := GetPoll(t, base, query)
	if status != http.StatusOK {
		t.Fatalf("poll %q: %d %s", query, status, body)
	}
	var p PollAnswer
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("poll %q: %v: %s", query, err, body)
	}
	return p
}

// PollLater sends one poll request (Poll) in the background and returns a
// function that returns its answer, failing the test unless it comes
// within WaitFor.
func PollLater(t testing.TB, base, query string) (answer func() PollAnswer) {
	got := make(chan PollAnswer, 1)
	go func() { got <- Poll(t, base, query) }()
	return func() PollAnswer {
		t.Helper()
		select {
		case p := <-got:
			return p
		case <-time.After(WaitFor):
			t.Fatalf("poll %q: no answer within %v", query, WaitFor)
			return PollAnswer{}
		}
	}
}

// StalledConn opens an SSE stream at srvURL from cursor on a raw TCP
// connection with a small receive buffer, reads at least minBytes of it,
// hello first, and then stops reading: the server's writes stall. The
// caller closes the connection.
func StalledConn(srvURL string, cursor, minBytes int) (net.Conn, error) {
	u, err := url.Parse(srvURL)
	if err != nil {
		return nil, err
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		return nil, err
	}
	conn.(*net.TCPConn).SetReadBuffer(16 << 10)
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nLast-Event-ID: %d\r\n\r\n", u.Host, cursor)
	conn.SetReadDeadline(time.Now().Add(WaitFor))
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 64<<10), nil)
	if err != nil {
		return conn, err
	}
	buf := make([]byte, 64<<10)
	var seen bytes.Buffer
	for n := 0; n < minBytes; {
		k, err := resp.Body.Read(buf)
		if seen.Len() < 4096 {
			seen.Write(buf[:min(k, 4096)])
		}
		n += k
		if err != nil {
			return conn, fmt.Errorf("read %d bytes, then %v", n, err)
		}
	}
	if !strings.Contains(seen.String(), "event: hello") {
		return conn, fmt.Errorf("no hello at the start: %q", seen.String()[:min(seen.Len(), 200)])
	}
	return conn, nil
}
