package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// serving runs a server from args on a real listener through Serve, as
// `replayd serve` does, and returns its base URL; the test's end drains it.
func serving(t *testing.T, args ...string) string {
	t.Helper()
	c, err := ParseServe(append([]string{"--db", filepath.Join(t.TempDir(), "t.db")}, args...), func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return "http://" + ln.Addr().String()
}

// fresh is a client keeping no connection open after a request.
var fresh = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// held sends head on a raw connection to base, then writes drip every
// 50 ms (none if empty), and returns what the server answered and how
// long until it closed the connection; it fails the test (and goes on) if
// the server still holds it after limit.
func held(t *testing.T, base, head, drip string, limit time.Duration) (answer string, open time.Duration) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t0 := time.Now()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for time.Since(t0) < limit {
		conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := conn.Read(buf)
		got.Write(buf[:n])
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if drip != "" {
				if _, err := io.WriteString(conn, drip); err != nil {
					return got.String(), time.Since(t0) // closed while we wrote
				}
			}
		case err != nil:
			return got.String(), time.Since(t0) // EOF or reset: closed
		}
	}
	t.Errorf("the server still holds the connection after %v (sent %q, dripping %q); it answered %q", limit, head, drip, got.String())
	return got.String(), limit
}

// statusOf is the status line of a raw answer.
func statusOf(answer string) string {
	line, _, _ := strings.Cut(answer, "\r\n")
	return line
}

const timeoutKey = "timeouts-test-key-0123456789"

// Slow headers, a dripped publish body and an idle keep-alive are closed
// within their timeouts, while an SSE stream and a long poll running
// longer than all of them go on and deliver, served through net/http or
// detached from it.
func TestServeTimeouts(t *testing.T) {
	for _, mode := range []string{"net/http", "detached"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"--detach=" + fmt.Sprint(mode == "detached")}
			testServeTimeouts(t, args...)
		})
	}
}

func testServeTimeouts(t *testing.T, args ...string) {
	const bound = 300 * time.Millisecond
	base := serving(t, append(args, "--publish-key", timeoutKey, "--public-topics", "pub-*", "--heartbeat", "100ms",
		"--read-header-timeout", bound.String(), "--read-timeout", bound.String(), "--idle-timeout", bound.String())...)
	limit := 2 * time.Second // well under the defaults, well over the bound
	t0 := time.Now()
	stream := wiretest.Dial(t, base+"/events?topic=pub-1", nil)
	_, _, cursor, _ := stream.Hello()
	poll := wiretest.PollLater(t, base, fmt.Sprintf("topic=pub-1&wait=20&cursor=%d", cursor))

	answer, open := held(t, base, "GET /healthz HTTP/1.1\r\nHost: x\r\n", "X-Slow: 1\r\n", limit)
	if answer != "" && !strings.Contains(statusOf(answer), "408") {
		t.Errorf("slow headers: answered %q", answer)
	}
	t.Logf("slow headers closed after %v", open)

	body := `{"topic":"pub-1","data":1}`
	answer, open = held(t, base, fmt.Sprintf("POST /publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", timeoutKey, len(body)+1000), " ", limit)
	if !strings.Contains(statusOf(answer), "408") {
		t.Errorf("dripped body: answered %q, want 408", answer)
	}
	t.Logf("dripped body closed after %v", open)

	// A body where none is read: net/http reads it after the answer, to
	// reuse the connection.
	answer, open = held(t, base, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{", " ", limit)
	t.Logf("dripped body to /healthz closed after %v, answered %q", open, statusOf(answer))

	answer, open = held(t, base, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "", limit)
	if !strings.Contains(statusOf(answer), "200") {
		t.Errorf("keep-alive: answered %q, want 200", answer)
	}
	if open < bound {
		t.Errorf("an idle keep-alive closed after %v, before the idle timeout %v", open, bound)
	}
	t.Logf("idle keep-alive closed after %v", open)

	if since := time.Since(t0); since < 3*bound {
		t.Fatalf("the checks took %v: the stream and poll did not outlast the timeouts", since)
	}
	req, _ := http.NewRequest("POST", base+"/publish", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+timeoutKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := fresh.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("publish: %d", resp.StatusCode)
	}
	ev := stream.NextNonHeartbeat()
	if p := poll(); len(p.IDs()) != 1 || p.IDs()[0] != cursor+1 || ev.ID != fmt.Sprint(cursor+1) {
		t.Fatalf("after %v: the stream got %q, the poll %v; want both %d", time.Since(t0), ev.ID, p.IDs(), cursor+1)
	}
	t.Logf("the stream and the poll delivered after %v", time.Since(t0))
}

// --max-tcp-connections counts every connection, streams (net/http's and
// detached ones) and idle keep-alives: one beyond it is closed at once,
// unanswered, and the slot a closed stream frees serves again.
func TestServeMaxTCPConnections(t *testing.T) {
	for _, mode := range []string{"net/http", "detached"} {
		t.Run(mode, func(t *testing.T) {
			base := serving(t, "--max-tcp-connections", "2", "--public-topics", "pub-*", "--detach="+fmt.Sprint(mode == "detached"))
			stream := wiretest.Dial(t, base+"/events?topic=pub-1", nil)
			stream.Hello()
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
				t.Fatalf("a keep-alive under the cap: %v", err)
			}
			answer, open := held(t, base, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "", 2*time.Second)
			if answer != "" {
				t.Fatalf("a connection beyond the cap was answered %q", answer)
			}
			t.Logf("a third connection closed after %v", open)
			stream.Close()
			wiretest.WaitUntil(t, "the slot of the closed stream to serve", func() bool {
				resp, err := fresh.Get(base + "/healthz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == 200
			})
		})
	}
}
