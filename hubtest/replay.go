package hubtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// stalledClient opens a resuming SSE stream over a bare TCP connection,
// reads until it has at least min bytes of the body, and then never reads
// again: its socket buffers fill and the server's writes block. Its small
// receive buffer stalls the server soon, but slows the reads before it
// (about 200 ms a connection, waiting for window updates): open many at
// once.
func stalledClient(t *testing.T, srvURL string, cursor, minBytes int) net.Conn {
	t.Helper()
	conn, err := stalledConn(srvURL, cursor, minBytes)
	if conn != nil {
		t.Cleanup(func() { conn.Close() })
	}
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A replay of large events to clients that stop reading holds about a page
// per connection, not the whole window; Close ends such streams at once
// (issue 8, item 2).
func testReplayMemoryBoundedAndCloseFast(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	const events, clients = 24, 8
	big := json.RawMessage(`"` + strings.Repeat("x", 1<<20-16) + `"`)
	for range events {
		mustPublish(t, h, "", big)
	}
	srv := serve(t, h)
	before := heapInUse()
	for range clients {
		stalledClient(t, srv.URL, 0, 2<<20)
	}
	grew := int64(heapInUse()) - int64(before)
	t.Logf("heap in use grew %.1f MiB with %d clients stalled in a %d MiB replay", float64(grew)/(1<<20), clients, events)
	// Generous: a page of one 1 MiB event and its frame buffer, and then
	// some, per client; the whole window would be 24 MiB (twice over).
	if limit := int64(clients * 6 << 20); grew > limit {
		t.Fatalf("heap in use grew %d MiB, want under %d MiB", grew>>20, limit>>20)
	}
	start := time.Now()
	h.Close()
	took := time.Since(start)
	t.Logf("Close took %v with %d clients mid-replay", took, clients)
	if took > 2*time.Second {
		t.Fatalf("Close took %v", took)
	}
}

func stalledConn(srvURL string, cursor, minBytes int) (net.Conn, error) {
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
	conn.SetReadDeadline(time.Now().Add(waitFor))
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
