package hubtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// End-to-end tests of the SSE endpoint over real HTTP.

func testSSEFreshClientGetsHelloThenLive(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	base := headOf(t, h)
	for range 3 {
		mustPublish(t, h, "a", 1)
	}
	c := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	f, topic, cursor, head := c.Hello()
	if *topic != "a" || cursor != base+3 || head != base+3 || f.ID != fmt.Sprint(base+3) {
		t.Fatalf("hello %+v", f)
	}
	ev := mustPublish(t, h, "a", "live")
	if f := c.Next(); f.ID != fmt.Sprint(ev.Sequence) || f.Event != "message" || f.Data != `"live"` {
		t.Fatalf("got %+v", f)
	}
}

func testSSETopicScopes(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	a := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	b := wiretest.Dial(t, srv.URL+"?topic=b", nil)
	g := wiretest.Dial(t, srv.URL, nil)
	for _, c := range []*wiretest.Client{a, b, g} {
		c.Hello()
	}
	// Relative to the head: 1:a 2:b 3:broadcast 4:c 5:a
	base := headOf(t, h)
	publishTopics(t, h, "a", "b", "", "c", "a")
	for c, want := range map[*wiretest.Client][]string{a: relIDs(base, 1, 3, 5), b: relIDs(base, 2, 3), g: relIDs(base, 1, 2, 3, 4, 5)} {
		if got := wiretest.FrameIDs(c.Events(len(want))); !slices.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
	}
	// b got nothing more: the next frame is the sentinel.
	mustPublish(t, h, "b", "sentinel")
	if f := b.Next(); f.ID != fmt.Sprint(base+6) {
		t.Fatalf("b got %+v", f)
	}
}

// Resuming within the replay limit: exactly what was missed, in order, no
// gap, then live; by header or by the lastEventId query parameter.
func testSSEResumeExact(t *testing.T, newLog func(t *testing.T) opener) {
	// Relative to the head b: 1..5.
	setup := func(t *testing.T) (h *replayd.EventHub, url string, b int64) {
		h = newLog(t)(replayd.Options{})
		b = headOf(t, h)
		publishTopics(t, h, "a", "b", "", "a", "b")
		return h, serve(t, h).URL, b
	}
	for _, tc := range []struct {
		name   string
		query  func(b int64) string
		header func(b int64) http.Header
	}{
		{"header", func(int64) string { return "?topic=a" }, func(b int64) http.Header { return wiretest.LastID(b + 1) }},
		{"query", func(b int64) string { return fmt.Sprintf("?topic=a&lastEventId=%d", b+1) }, func(int64) http.Header { return nil }},
		{"header wins", func(b int64) string { return fmt.Sprintf("?topic=a&lastEventId=%d", b+4) }, func(b int64) http.Header { return wiretest.LastID(b + 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, url, b := setup(t)
			c := wiretest.Dial(t, url+tc.query(b), tc.header(b))
			_, _, cursor, head := c.Hello()
			if cursor != b+1 || head != b+5 {
				t.Fatalf("cursor %d head %d", cursor, head)
			}
			if got := wiretest.FrameIDs(c.Events(2)); !slices.Equal(got, relIDs(b, 3, 4)) {
				t.Fatalf("replayed %v", got)
			}
			ev := mustPublish(t, h, "a", "live")
			c.NextIs(ev.Sequence, "live")
		})
	}
	t.Run("from zero and at the head", func(t *testing.T) {
		h, url, b := setup(t)
		c := wiretest.Dial(t, url+"?topic=b", wiretest.LastID(0))
		c.Hello()
		if got := wiretest.FrameIDs(c.Events(3)); !slices.Equal(got, relIDs(b, 2, 3, 5)) {
			t.Fatalf("from 0: %v", got)
		}
		c = wiretest.Dial(t, url+"?topic=b", wiretest.LastID(b+5))
		if _, _, cursor, _ := c.Hello(); cursor != b+5 {
			t.Fatalf("cursor %d", cursor)
		}
		ev := mustPublish(t, h, "b", "next")
		c.NextIs(ev.Sequence, "at head, first frame")
	})
}

func testSSEMultiLinePayload(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	payloads := []string{
		"{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n}",
		"{\"trailing\": true}\n",
		"\n\n[1]\n\n",
		`"data: not a field\nid: 99"`,
	}
	base := headOf(t, h)
	for _, p := range payloads {
		mustPublish(t, h, "a", json.RawMessage(p))
	}
	mustPublish(t, h, "a", json.RawMessage("{\r\n\"crlf\": 1\r}"))
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0))
	c.Hello()
	for i, p := range payloads {
		f := c.Next()
		if f.Data != p || f.ID != fmt.Sprint(base+int64(i)+1) || f.Event != "message" {
			t.Errorf("payload %d arrived as %q (id %s), want %q", i, f.Data, f.ID, p)
		}
	}
	// CR and CRLF are line breaks to SSE: they come back as LF.
	if f := c.Next(); f.Data != "{\n\"crlf\": 1\n}" {
		t.Errorf("CRLF payload arrived as %q", f.Data)
	}
}

func testSSERetryAndHeartbeats(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	cases := []struct {
		name string
		data func(string) any
		want func(t *testing.T, d map[string]any, topic string)
	}{
		{"plain", nil, func(t *testing.T, d map[string]any, _ string) {
			if len(d) != 1 {
				t.Errorf("heartbeat data %v", d)
			}
		}},
		{"object merged", func(topic string) any { return map[string]any{"clients": 3, "topic": topic} },
			func(t *testing.T, d map[string]any, topic string) {
				if d["clients"] != float64(3) || d["topic"] != topic || len(d) != 3 {
					t.Errorf("heartbeat data %v", d)
				}
			}},
		{"non-object under data", func(string) any { return "ok" }, func(t *testing.T, d map[string]any, _ string) {
			if d["data"] != "ok" || len(d) != 2 {
				t.Errorf("heartbeat data %v", d)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := open(replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: 20 * time.Millisecond, HeartbeatData: tc.data, Retry: 1500 * time.Millisecond}})
			srv := serve(t, h)
			for _, topic := range []string{"room", ""} {
				c := wiretest.Dial(t, srv.URL+"?topic="+topic, nil)
				// retry: shares the hello's block: a block of its own reaches
				// r3labs/sse and go-sse applications as an empty event.
				if f, _, _, _ := c.Hello(); f.Retry != "1500" {
					t.Fatalf("hello %+v, want retry: 1500 in its block", f)
				}
				f := c.Next()
				if f.Event != "heartbeat" || f.HasID {
					t.Fatalf("frame %+v, want a heartbeat without id", f)
				}
				var d map[string]any
				if err := json.Unmarshal([]byte(f.Data), &d); err != nil {
					t.Fatal(err)
				}
				ms, ok := d["t"].(float64)
				if !ok || time.Since(time.UnixMilli(int64(ms))) > time.Minute {
					t.Fatalf("heartbeat t %v", d["t"])
				}
				tc.want(t, d, topic)
			}
		})
	}
	t.Run("off", func(t *testing.T) {
		h := open(replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
		srv := serve(t, h)
		c := wiretest.Dial(t, srv.URL, nil)
		if f := c.Next(); f.Event != "hello" || f.Retry != "" {
			t.Fatalf("no retry configured, first frame %+v", f)
		}
		// No heartbeat within ten times a short interval.
		c.Quiet(200 * time.Millisecond)
	})
}

// Many goroutines publishing while clients connect and resume: each
// connection's ids strictly increase, with no duplicates and no holes.
func testSSEConcurrentPublishAndConnect(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 100000}})
	srv := serve(t, h)
	base := headOf(t, h)
	const writers, each = 8, 60
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := h.Publish(context.Background(), "", fmt.Sprint(w, "-", i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	// Clients join at random moments while publishing runs, all from 0.
	clients := make([]*wiretest.Client, 0, 8)
	for range 8 {
		clients = append(clients, wiretest.Dial(t, srv.URL, wiretest.LastID(0)))
	}
	wg.Wait()
	total := writers * each
	for i, c := range clients {
		c.Hello()
		got := c.Events(total)
		for j, f := range got {
			if f.ID != strconv.FormatInt(base+int64(j)+1, 10) {
				t.Fatalf("client %d: frame %d has id %s", i, j, f.ID)
			}
		}
	}
}

// A client that never reads is disconnected once its unsent frames pass
// MaxBufferedBytes; publishers never wait on it and other clients get
// everything.
func testSSESlowConsumerDisconnected(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{MaxBufferedBytes: 256 << 10}})
	srv := serve(t, h)

	// The slow client: a raw connection that sends the request and never
	// reads, so the server's writes stall once the socket buffers fill.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /?topic=slow HTTP/1.1\r\nHost: %s\r\n\r\n", srv.Listener.Addr())
	wiretest.WaitUntil(t, "slow client connected", func() bool { return h.Clients().ActiveClients("slow") == 1 })

	fast := wiretest.Dial(t, srv.URL+"?topic=slow", nil)
	fast.Hello()

	// Publish in step with the fast client, so only the slow one falls
	// behind; a publish held up by the slow client fails on its deadline.
	big := json.RawMessage(`"` + strings.Repeat("x", 64<<10) + `"`)
	const n = 320 // 20 MiB: more than loopback socket buffers hold
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		ev, err := h.Publish(ctx, "slow", big)
		cancel()
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		fast.NextIs(ev.Sequence, "fast client")
	}
	wiretest.WaitUntil(t, "slow client disconnected", func() bool { return h.Clients().ActiveClients("slow") == 1 })
	// The slow connection was closed by the server.
	conn.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.Copy(io.Discard, bufio.NewReader(conn)); err != nil {
		t.Fatalf("slow connection not closed: %v", err)
	}
}

// atoi parses decimal ids, failing the test on one that is not.
func atoi(t testing.TB, ids []string) []int64 {
	t.Helper()
	out := make([]int64, len(ids))
	for i, id := range ids {
		if _, err := fmt.Sscan(id, &out[i]); err != nil {
			t.Fatalf("id %q: %v", id, err)
		}
	}
	return out
}
