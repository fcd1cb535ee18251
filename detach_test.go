package replayd

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// testDetach makes newTestHub turn SSEOptions.DetachConnections on; set
// only through withDetach (tests in this package do not run in parallel).
var testDetach bool

// withDetach runs body with every test hub detaching its streams, and
// fails unless at least one stream did.
func withDetach(t *testing.T, body func(t *testing.T)) {
	t.Helper()
	var detached atomic.Int64
	testDetach = true
	testHookDetached = func() { detached.Add(1) }
	defer func() {
		testDetach = false
		testHookDetached = nil
	}()
	body(t)
	if !t.Failed() && detached.Load() == 0 {
		t.Errorf("no stream was served detached")
	}
}

// TestSSEDetached runs this package's SSE tests again with
// DetachConnections on: every guarantee holds on the hijacked path too.
// The end-to-end tests that moved to hubtest run detached in
// TestHubSuite/Detached (suite_test.go), which also checks that HTTP/2
// falls back and detaches nothing.
func TestSSEDetached(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"HandshakeRaceBeforeRead", TestSSEHandshakeRaceBeforeRead},
		{"HandshakeRaceBeforeLive", TestSSEHandshakeRaceBeforeLive},
		{"SlowConsumerCutIsLogged", TestSSESlowConsumerCutIsLogged},
		{"StatsAndTracker", TestStatsAndTracker},
		{"ConnectionCap", TestSSEConnectionCap},
		{"Authorize", TestSSEAuthorize},
		{"ReplayPruneBetweenPagesEndsStream", TestReplayPruneBetweenPagesEndsStream},
		{"CloseManyClientsMidReplay", TestCloseManyClientsMidReplay},
		{"Load", TestLoad}, // skipped with -short, as on today's path
		// Not TestSSERevokedContextEndsStream: a detached stream's context
		// is not the request's (doc.go), by design. WithRevocation reaches
		// it: TestSSERevokeWatchUnregisters, TestSSERevokedBeforeStart and
		// hubtest's SSERevokedSessionEndsStream run detached.
	} {
		t.Run(tc.name, func(t *testing.T) { withDetach(t, tc.fn) })
	}
}

// The hijacked response is framed by the connection's end: no chunking,
// Connection: close, and the stream's headers.
func TestSSEDetachedFraming(t *testing.T) {
	withDetach(t, func(t *testing.T) {
		db, _ := openTestDB(t)
		h := newTestHub(t, db, Options{SSE: SSEOptions{HeartbeatInterval: -1}})
		srv := serve(t, h)
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(waitFor))
		fmt.Fprintf(conn, "GET /?topic=a HTTP/1.1\r\nHost: %s\r\n\r\n", srv.Listener.Addr())
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || len(resp.TransferEncoding) != 0 || !resp.Close || resp.ContentLength != -1 ||
			resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" || resp.Header.Get("Date") == "" {
			t.Fatalf("response %d %v close=%v length=%d %v", resp.StatusCode, resp.TransferEncoding, resp.Close, resp.ContentLength, resp.Header)
		}
		head, err := h.LatestSequence(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("id: %d\n", head) {
			t.Fatalf("first body line %q, %v", line, err)
		}
		// Close ends the response with the connection.
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, br); err != nil {
			t.Fatalf("after Close: %v", err)
		}
	})
}

// A client that leaves is noticed: on Linux at once, by the departure
// watcher, with no heartbeat or write due; elsewhere (and here with the
// watcher off) at the next heartbeat, by the check before a write after a
// silence. The tracker, the connection gauge and the subscription then let
// go. Over plain TCP and TLS.
func TestSSEDetachedClientLeaveNoticed(t *testing.T) {
	for _, watch := range []bool{true, false} {
		for _, tlsOn := range []bool{false, true} {
			t.Run(fmt.Sprintf("watch=%v/tls=%v", watch, tlsOn), func(t *testing.T) {
				if watch && runtime.GOOS != "linux" {
					t.Skip("the departure watcher is Linux's")
				}
				if !watch {
					defer func(old bool) { departureWatch = old }(departureWatch)
					departureWatch = false
				}
				withDetach(t, func(t *testing.T) { testDetachedLeave(t, watch, tlsOn) })
			})
		}
	}
}

func testDetachedLeave(t *testing.T, watch, tlsOn bool) {
	db, _ := openTestDB(t)
	// Longer than departureIdle, so each heartbeat first checks; none at
	// all with the watcher.
	beat := departureIdle + 200*time.Millisecond
	if watch {
		beat = -1
	}
	h := newTestHub(t, db, Options{SSE: SSEOptions{HeartbeatInterval: beat}})
	srv := httptest.NewUnstartedServer(h.Handler())
	if tlsOn {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	c := dialWith(t, srv.Client(), srv.URL+"?topic=a", nil)
	c.Hello()
	if !watch {
		if f := c.Next(); f.Event != "heartbeat" {
			t.Fatalf("want a heartbeat, got %+v", f)
		}
	}
	if h.Clients().ActiveClients("a") != 1 || h.metrics.conns(transportSSE).Load() != 1 {
		t.Fatalf("tracker %d, gauge %d", h.Clients().ActiveClients("a"), h.metrics.conns(transportSSE).Load())
	}
	left := time.Now()
	c.Close()
	wiretest.WaitUntil(t, "the stream to end", func() bool { return h.live.OpenStreams() == 0 })
	d := time.Since(left)
	t.Logf("noticed after %v", d)
	switch {
	case watch && d > time.Second:
		t.Errorf("the watcher noticed after %v", d)
	case !watch && d > beat+beat/2:
		// Without the check a write would succeed at the next heartbeat
		// and fail only at the one after: two intervals.
		t.Errorf("noticed after %v", d)
	}
	if h.Clients().ActiveClients("a") != 0 || h.metrics.conns(transportSSE).Load() != 0 {
		t.Fatalf("after leaving: tracker %d, gauge %d", h.Clients().ActiveClients("a"), h.metrics.conns(transportSSE).Load())
	}
	subs := h.live.StreamsOf("a")
	if subs != 0 {
		t.Fatalf("%d subscriptions left", subs)
	}
}

// Over TLS the hijacked connection is a *tls.Conn: hello, replay, live and
// heartbeat frames go through it, and Close ends the stream.
func TestSSEDetachedTLS(t *testing.T) {
	withDetach(t, func(t *testing.T) {
		db, _ := openTestDB(t)
		h := newTestHub(t, db, Options{SSE: SSEOptions{HeartbeatInterval: 50 * time.Millisecond}})
		var isTLS atomic.Bool
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			isTLS.Store(r.TLS != nil && r.ProtoMajor == 1)
			h.Handler().ServeHTTP(w, r)
		}))
		srv.StartTLS()
		t.Cleanup(srv.Close)
		first := mustPublish(t, h, "a", 1)
		c := dialWith(t, srv.Client(), srv.URL+"?topic=a", wiretest.LastID(0))
		if !isTLS.Load() || c.Response().TLS == nil || c.Response().ProtoMajor != 1 || !c.Response().Close {
			t.Fatalf("not a detached HTTP/1.1 TLS stream: %s close=%v", c.Response().Proto, c.Response().Close)
		}
		c.Hello()
		if f := c.NextNonHeartbeat(); f.ID != fmt.Sprint(first.Sequence) {
			t.Fatalf("replayed %+v", f)
		}
		ev := mustPublish(t, h, "a", map[string]string{"big": strings.Repeat("x", 100<<10)})
		if f := c.NextNonHeartbeat(); f.ID != fmt.Sprint(ev.Sequence) {
			t.Fatalf("live %+v", f)
		}
		for {
			if f := c.Next(); f.Event == "heartbeat" {
				break
			}
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.NextErr(waitFor); err == nil || err == wiretest.ErrTimeout {
			t.Fatalf("stream not ended by Close: %v", err)
		}
	})
}

// Close ends detached streams whose clients stopped reading, promptly, and
// leaves none of their goroutines behind; http.Server.Close alone does not
// reach them (they are no longer the server's).
func TestSSEDetachedCloseWithStuckClients(t *testing.T) {
	withDetach(t, func(t *testing.T) {
		db, _ := openTestDB(t)
		h := newTestHub(t, db, Options{SSE: SSEOptions{MaxBufferedBytes: -1}})
		srv := serve(t, h)
		var conns []net.Conn
		for range 3 {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "GET /?topic=stuck HTTP/1.1\r\nHost: x\r\n\r\n")
			conns = append(conns, conn)
		}
		wiretest.WaitUntil(t, "3 streams", func() bool { return h.Clients().ActiveClients("stuck") == 3 })
		big := strings.Repeat("x", 256<<10)
		for range 40 { // 10 MiB each: their writes block
			mustPublish(t, h, "stuck", big)
		}
		srv.Close() // the server lets go of them; they go on
		if n := h.Clients().ActiveClients("stuck"); n != 3 {
			t.Fatalf("%d streams after http.Server.Close, want 3", n)
		}
		start := time.Now()
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Close took %v", d)
		}
		if n := h.Clients().ActiveClients("stuck"); n != 0 {
			t.Fatalf("%d streams after Close", n)
		}
		buf := make([]byte, 64<<10)
		for _, conn := range conns {
			conn.SetReadDeadline(time.Now().Add(waitFor))
			for {
				if _, err := conn.Read(buf); err != nil {
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						t.Fatal("connection not closed by Close")
					}
					break
				}
			}
		}
		// goleak in TestMain checks that no stream goroutine is left.
		runtime.Gosched()
	})
}

// Many clients leave: the tracker and the connection gauge come back to
// zero (no drift once every stream noticed).
func TestSSEDetachedCountsSettle(t *testing.T) {
	withDetach(t, func(t *testing.T) {
		db, _ := openTestDB(t)
		h := newTestHub(t, db, Options{SSE: SSEOptions{HeartbeatInterval: 20 * time.Millisecond}})
		srv := serve(t, h)
		var cs []*wiretest.Client
		for i := range 20 {
			c := dialWith(t, srv.Client(), fmt.Sprintf("%s?topic=t%d", srv.URL, i%3), nil)
			c.Hello()
			cs = append(cs, c)
		}
		if got := h.Clients().Total(); got != 20 {
			t.Fatalf("tracker total %d", got)
		}
		for _, c := range cs {
			c.Close()
		}
		wiretest.WaitUntil(t, "every stream to end", func() bool {
			return h.Clients().Total() == 0 && h.metrics.conns(transportSSE).Load() == 0
		})
	})
}

// dialWith is dial with a given client (for TLS).
func dialWith(t testing.TB, client *http.Client, url string, header http.Header) *wiretest.Client {
	t.Helper()
	c, status := wiretest.DialClientStatus(t, client, url, header)
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d", url, status)
	}
	return c
}

// A panic on a detached stream's goroutine (here a HeartbeatData function's)
// ends that stream, logged, and not the process, as net/http does for a
// handler; the hub goes on serving.
func TestSSEDetachedPanicEndsOnlyTheStream(t *testing.T) {
	withDetach(t, func(t *testing.T) {
		db, _ := openTestDB(t)
		logs := &wiretest.LogRecorder{}
		var panics atomic.Bool
		h := newTestHub(t, db, Options{Logger: slog.New(logs), SSE: SSEOptions{
			HeartbeatInterval: 20 * time.Millisecond,
			HeartbeatData: func(string) any {
				if panics.Load() {
					panic("heartbeat data")
				}
				return nil
			},
		}})
		srv := serve(t, h)
		panics.Store(true)
		c := wiretest.Dial(t, srv.URL+"?topic=a", nil)
		c.Hello()
		for {
			f, err := c.NextErr(waitFor)
			if err != nil {
				if err == wiretest.ErrTimeout {
					t.Fatal("stream not ended by the panic")
				}
				break
			}
			if f.Event != "heartbeat" {
				t.Fatalf("frame %+v", f)
			}
		}
		wiretest.WaitUntil(t, "the panic logged", func() bool {
			return logs.Has(slog.LevelError, "panic serving a detached stream", "panic", "heartbeat data")
		})
		panics.Store(false)
		c2 := wiretest.Dial(t, srv.URL+"?topic=a", nil)
		c2.Hello()
		ev := mustPublish(t, h, "a", 1)
		if f := c2.NextNonHeartbeat(); f.ID != fmt.Sprint(ev.Sequence) {
			t.Fatalf("after the panic: %+v", f)
		}
		wiretest.WaitUntil(t, "the panicked stream released", func() bool { return h.Clients().ActiveClients("a") == 1 })
	})
}

// flushOnly is a middleware's ResponseWriter that can flush but neither
// hijack nor unwrap.
type flushOnly struct{ w http.ResponseWriter }

func (f flushOnly) Header() http.Header         { return f.w.Header() }
func (f flushOnly) Write(b []byte) (int, error) { return f.w.Write(b) }
func (f flushOnly) WriteHeader(code int)        { f.w.WriteHeader(code) }
func (f flushOnly) Flush()                      { f.w.(http.Flusher).Flush() }

// A ResponseWriter that cannot hijack falls back to today's path: the
// stream works, chunked, and nothing detaches.
func TestSSEDetachedFallsBackWithoutHijacker(t *testing.T) {
	var detached atomic.Int64
	testDetach, testHookDetached = true, func() { detached.Add(1) }
	defer func() { testDetach, testHookDetached = false, nil }()
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.Handler().ServeHTTP(flushOnly{w}, r)
	}))
	t.Cleanup(srv.Close)
	c := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	c.Hello()
	ev := mustPublish(t, h, "a", 1)
	if f := c.NextNonHeartbeat(); f.ID != fmt.Sprint(ev.Sequence) {
		t.Fatalf("live %+v", f)
	}
	if detached.Load() != 0 || c.Response().Close || len(c.Response().TransferEncoding) == 0 {
		t.Fatalf("detached %d, close=%v, transfer encoding %v", detached.Load(), c.Response().Close, c.Response().TransferEncoding)
	}
}
