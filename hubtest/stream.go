package hubtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Tests of one stream's shape and limits: the retry field's placement, the
// queue cap against the largest frame, and a ResponseWriter that cannot
// flush.

// The stream begins with one block holding retry and the hello, byte for
// byte: "retry: N\nid: c\nevent: hello\ndata: …\n\n".
func testSSERetryInHelloBlock(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{Retry: 2 * time.Second, HeartbeatInterval: -1}})
	srv := serve(t, h)
	ev := mustPublish(t, h, "", 1)
	resp, err := http.Get(srv.URL + "?topic=room")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var block strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", block.String(), err)
		}
		block.WriteString(line)
		if line == "\n" {
			break
		}
	}
	// The hello's data is checked elsewhere; here its place in the block.
	got := block.String()
	if !strings.HasPrefix(got, fmt.Sprintf("retry: 2000\nid: %d\nevent: hello\ndata: {", ev.Sequence)) || strings.Count(got, "\n") != 5 {
		t.Fatalf("first block %q, want retry, id, event and one data line", got)
	}
}

// A frame of the largest payload Publish accepts always fits a connection's
// queue under the default MaxBufferedBytes, whatever its shape: 1 MiB on one
// line, or a pretty-printed array whose "data: " prefixes (one per line)
// make the frame far larger than the payload.
func testSSELargestFrameFitsDefaultCap(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	logs := &wiretest.LogRecorder{}
	h := open(replayd.Options{Logger: slog.New(logs), SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	srv := serve(t, h)
	c := wiretest.Dial(t, srv.URL+"?topic=big", nil)
	c.Hello()

	// The largest payload Publish accepts: 1 MiB.
	oneLine := `"` + strings.Repeat("x", 1<<20-2) + `"`
	pretty := "[" + strings.Repeat("\n0,", 136532) + "\n0\n]" // 409,601 bytes
	if len(oneLine) != 1<<20 || len(pretty) != 409601 {
		t.Fatalf("payload sizes %d, %d", len(oneLine), len(pretty))
	}
	for _, p := range []string{oneLine, pretty} {
		ev := mustPublish(t, h, "big", json.RawMessage(p))
		f, err := c.NextErr(waitFor)
		if err != nil {
			t.Fatalf("%d-byte payload: the stream ended: %v; logs:\n%s", len(p), err, logs)
		}
		if f.ID != fmt.Sprint(ev.Sequence) || f.Data != p {
			t.Fatalf("frame id %s with %d bytes of data, want %d with %d", f.ID, len(f.Data), ev.Sequence, len(p))
		}
	}
}

// noFlushWriter is a middleware's ResponseWriter with neither Flush nor
// Unwrap: nothing it is given can ever reach the client before the
// handler returns.
type noFlushWriter struct{ w http.ResponseWriter }

func (n noFlushWriter) Header() http.Header         { return n.w.Header() }
func (n noFlushWriter) Write(b []byte) (int, error) { return n.w.Write(b) }
func (n noFlushWriter) WriteHeader(code int)        { n.w.WriteHeader(code) }

// unwrapWriter hides Flush but offers Unwrap, as http.ResponseController
// expects of a middleware.
type unwrapWriter struct{ noFlushWriter }

func (u unwrapWriter) Unwrap() http.ResponseWriter { return u.w }

// Behind a ResponseWriter that cannot flush, a stream is refused at once
// with a 500 and a plain-text reason, and the cause is logged at Error once
// per hub; one that unwraps to a Flusher streams.
func testSSEWriterWithoutFlush(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	logs := &wiretest.LogRecorder{}
	h := open(replayd.Options{Logger: slog.New(logs), SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	var wrap func(http.ResponseWriter) http.ResponseWriter
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.Handler().ServeHTTP(wrap(w), r)
	}))
	t.Cleanup(srv.Close)

	wrap = func(w http.ResponseWriter) http.ResponseWriter { return noFlushWriter{w} }
	for range 3 {
		resp, err := http.Get(srv.URL + "?topic=room")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "Flush") ||
			!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Fatalf("status %d, %s, body %q; want 500 naming Flush", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	if n := logs.Count(slog.LevelError, "Flush", "", ""); n != 1 {
		t.Fatalf("%d Error logs naming Flush, want 1:\n%s", n, logs)
	}
	if h.Clients().Total() != 0 || len(h.Clients().Snapshot()) != 0 {
		t.Fatalf("a refused stream reached the tracker: %+v", h.Clients().Snapshot())
	}

	wrap = func(w http.ResponseWriter) http.ResponseWriter { return unwrapWriter{noFlushWriter{w}} }
	c := wiretest.Dial(t, srv.URL+"?topic=room", nil)
	c.Hello()
	ev := mustPublish(t, h, "room", 1)
	c.NextIs(ev.Sequence, "frame")
}
