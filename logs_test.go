package replayd

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// logRecorder collects a hub's log records as JSON objects.
type logRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logRecorder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logRecorder) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logRecorder) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// A slow consumer's cut is logged once, at info level, with its topic and
// remote address and nothing of the payload; it is counted once.
func TestSlowConsumerCutIsLogged(t *testing.T) {
	var rec logRecorder
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{Logger: rec.logger(), SSE: SSEOptions{MaxBufferedBytes: 4096}})
	srv := serve(t, h)
	c := dial(t, srv.URL+"?topic=slow", nil)
	c.hello()
	// A frame bigger than the cap on its own: the queue cannot take it.
	secret := "payload-" + strings.Repeat("x", 5000)
	mustPublish(t, h, "slow", secret)
	if f, err := c.nextErr(waitFor); err == nil {
		t.Fatalf("frame %+v after the cut", f)
	}
	waitUntil(t, "the stream to end", func() bool { return h.Metrics().SSEConnections == 0 })
	if n := h.Metrics().SlowConsumerDisconnects; n != 1 {
		t.Fatalf("%d slow-consumer disconnects counted", n)
	}
	rec.mu.Lock()
	logged := rec.buf.String()
	rec.mu.Unlock()
	if strings.Contains(logged, "payload-") {
		t.Fatalf("payload logged: %s", logged)
	}
	var cuts int
	for _, r := range rec.records(t) {
		if r["msg"] == "replayd: slow consumer disconnected" {
			cuts++
			if r["level"] != "INFO" || r["topic"] != "slow" || !strings.HasPrefix(r["remote"].(string), "127.0.0.1:") {
				t.Fatalf("cut logged as %v", r)
			}
		}
	}
	if cuts != 1 {
		t.Fatalf("%d cuts logged, want 1: %v", cuts, rec.records(t))
	}
}
