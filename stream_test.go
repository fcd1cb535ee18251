package replayd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Tests of one stream's shape and limits: the retry field's placement, the
// queue cap against the largest frame, and a ResponseWriter that cannot
// flush.

// A client cut as a slow consumer is logged, with its topic and address.
func TestSSESlowConsumerCutIsLogged(t *testing.T) {
	db, _ := openTestDB(t)
	logs := &logRecorder{}
	h := newTestHub(t, db, Options{Logger: slog.New(logs), SSE: SSEOptions{MaxBufferedBytes: 1, HeartbeatInterval: -1}})
	release := make(chan struct{})
	h.testHookBeforeLive = func() { <-release }
	srv := serve(t, h)
	c := dial(t, srv.URL+"?topic=slow", nil)
	c.hello()
	// The handler is held before going live: the first frame is queued
	// although it passes the 1-byte cap, the second cuts the client.
	mustPublish(t, h, "slow", 1)
	mustPublish(t, h, "slow", 2)
	close(release)
	if f, err := c.nextErr(waitFor); err == nil {
		t.Fatalf("stream went on with %+v, want it cut", f)
	}
	waitUntil(t, "the cut logged", func() bool {
		return logs.has(slog.LevelInfo, "slow consumer", "topics", "slow") && logs.has(slog.LevelInfo, "slow consumer", "remote", "")
	})
}

// logRecorder is a slog.Handler keeping every record, for tests that
// assert what is logged.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// has reports whether a record at level or above holds msg in its message
// and, if key is not "", an attribute key whose value holds value.
func (l *logRecorder) has(level slog.Level, msg, key, value string) bool {
	return l.count(level, msg, key, value) > 0
}

func (l *logRecorder) count(level slog.Level, msg, key, value string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level < level || !strings.Contains(r.Message, msg) {
			continue
		}
		found := key == ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key && strings.Contains(a.Value.String(), value) {
				found = true
			}
			return !found
		})
		if found {
			n++
		}
	}
	return n
}

func (l *logRecorder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs {
		fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
		b.WriteByte('\n')
	}
	return b.String()
}
