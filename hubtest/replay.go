package hubtest

import (
	"encoding/json"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// stalledClient opens a resuming SSE stream over a bare TCP connection,
// reads until it has at least min bytes of the body, and then never reads
// again: its socket buffers fill and the server's writes block. Its small
// receive buffer stalls the server soon, but slows the reads before it
// (about 200 ms a connection, waiting for window updates): open many at
// once.
func stalledClient(t *testing.T, srvURL string, cursor, minBytes int) net.Conn {
	t.Helper()
	conn, err := wiretest.StalledConn(srvURL, cursor, minBytes)
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
