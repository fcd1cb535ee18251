package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern, topic string
		match          bool
	}{
		{"*", "", true},
		{"*", "room-1", true},
		{"room-*", "room-1", true},
		{"room-*", "room-", true},
		{"room-*", "room", false},
		{"room-*", "", false},
		{"room-1", "room-1", true},
		{"room-1", "room-10", false},
		{"room-1", "", false},
	} {
		if got := Pattern(tc.pattern).Match(tc.topic); got != tc.match {
			t.Errorf("%q matches %q: %v, want %v", tc.pattern, tc.topic, got, tc.match)
		}
	}
}

// newTestServer runs a server on a SQLite file in t.TempDir over a real
// HTTP listener.
func newTestServer(t testing.TB, args ...string) (*Server, *httptest.Server) {
	t.Helper()
	c, err := ParseServe(append([]string{"--db", filepath.Join(t.TempDir(), "s.db")}, args...), func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.Close()
		srv.Close()
	})
	return s, srv
}

// The handler in-process: a publish goes through PublishBatch to the log.
func TestPublishInProcess(t *testing.T) {
	s, srv := newTestServer(t, "--publish-key", "k")
	before, err := s.Hub().LatestSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", srv.URL+"/publish", strings.NewReader(`[{"topic":"a","data":1},{"topic":"b","data":2}]`))
	req.Header.Set("Authorization", "Bearer k")
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, req)
	if w.Code != 200 || !strings.HasPrefix(w.Body.String(), fmt.Sprintf(`[{"sequence":%d,`, before+1)) {
		t.Fatalf("%d %s, want the first sequence %d", w.Code, w.Body.String(), before+1)
	}
	if head, err := s.Hub().LatestSequence(context.Background()); err != nil || head != before+2 {
		t.Fatalf("head %d %v, want %d", head, err, before+2)
	}
}

// Requests whose tokens expire in the same second share one context, which
// ends then and is forgotten.
func TestExpiriesShared(t *testing.T) {
	var e expiries
	at := time.Now().Add(1500 * time.Millisecond)
	a, b := e.at(at), e.at(at.Add(time.Millisecond))
	if a != b && at.Unix() == at.Add(time.Millisecond).Unix() {
		t.Fatal("two contexts for one second")
	}
	select {
	case <-a.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the expiry context did not end")
	}
	if time.Now().Before(time.Unix(at.Unix(), 0)) {
		t.Fatal("ended before the expiry")
	}
	deadline := time.Now().Add(time.Second)
	for {
		e.mu.Lock()
		n := len(e.m)
		e.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d expiries kept after they ended", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
