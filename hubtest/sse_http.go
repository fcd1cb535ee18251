package hubtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

func testSSEHeadersAndHead(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	c := wiretest.Dial(t, srv.URL, nil)
	for k, want := range map[string]string{
		"Content-Type":      "text/event-stream; charset=utf-8",
		"Cache-Control":     "no-cache, no-transform",
		"X-Accel-Buffering": "no",
	} {
		if got := c.Response().Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	// The hello arrives without any event being published: headers and
	// frames are flushed as written.
	c.Hello()

	resp, err := http.Head(srv.URL + "?topic=a")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" || len(body) != 0 {
		t.Fatalf("HEAD: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

func testSSEMethods(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		req, _ := http.NewRequest(m, srv.URL, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD, OPTIONS" {
			t.Errorf("%s: %d, Allow %q", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	req, _ := http.NewRequest("OPTIONS", srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || resp.Header.Get("Allow") == "" {
		t.Errorf("OPTIONS without Origin: %d", resp.StatusCode)
	}
}

func testSSEOrigins(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	const page = "http://app.example:8080"
	cases := []struct {
		name    string
		allowed []string
		method  string
		origin  string // "self" = the server's own origin
		status  int
		acao    string
		vary    bool
	}{
		{"default, no origin", nil, "GET", "", 200, "", false},
		{"default, same origin", nil, "GET", "self", 200, "", false},
		{"default, other origin", nil, "GET", page, 403, "", false},
		{"default, preflight other", nil, "OPTIONS", page, 403, "", false},
		{"default, preflight same", nil, "OPTIONS", "self", 204, "", false},
		{"any, other origin", []string{"*"}, "GET", page, 200, "*", false},
		{"any, no origin", []string{"*"}, "GET", "", 200, "*", false},
		{"any, preflight", []string{"*"}, "OPTIONS", page, 204, "*", false},
		{"list, listed", []string{"http://x.example", page}, "GET", page, 200, page, true},
		{"list, port differs", []string{"http://app.example:8081"}, "GET", page, 403, "", true},
		{"list, scheme differs", []string{"https://app.example:8080"}, "GET", page, 403, "", true},
		{"list, no origin", []string{page}, "GET", "", 200, "", true},
		{"list, null origin", []string{page}, "GET", "null", 403, "", true},
		{"list, preflight listed", []string{page}, "OPTIONS", page, 204, page, true},
		{"list, preflight other", []string{page}, "OPTIONS", "http://evil.example", 403, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := open(replayd.Options{SSE: replayd.SSEOptions{AllowedOrigins: tc.allowed}})
			srv := serve(t, h)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, tc.method, srv.URL, nil)
			origin := tc.origin
			if origin == "self" {
				origin = srv.URL
			}
			if origin != "" {
				req.Header.Set("Origin", origin)
			}
			if tc.method == "OPTIONS" {
				req.Header.Set("Access-Control-Request-Method", "GET")
				req.Header.Set("Access-Control-Request-Headers", "last-event-id")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := resp.Header.Get("Access-Control-Allow-Origin"); got != tc.acao {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", got, tc.acao)
			}
			if got := slices.Contains(resp.Header.Values("Vary"), "Origin"); got != tc.vary {
				t.Errorf("Vary: Origin present = %v, want %v", got, tc.vary)
			}
			if tc.method == "OPTIONS" && tc.status == 204 {
				if m := resp.Header.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "GET") {
					t.Errorf("Allow-Methods %q", m)
				}
				hdrs := strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers"))
				if !strings.Contains(hdrs, "last-event-id") || !strings.Contains(hdrs, "cache-control") {
					t.Errorf("Allow-Headers %q", hdrs)
				}
			}
			if tc.status == 403 {
				if b, _ := io.ReadAll(resp.Body); strings.Contains(string(b), "event:") {
					t.Errorf("forbidden request got a stream: %q", b)
				}
			}
		})
	}
}

func testSSEInvalidTopic(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{TopicParam: "room"}})
	srv := serve(t, h)
	for _, topic := range []string{strings.Repeat("x", 257), "a\x01b", "a\xffb"} {
		resp, err := http.Get(srv.URL + "?room=" + url.QueryEscape(topic))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || !strings.Contains(string(body), "topic") {
			t.Errorf("topic %q: %d %q", topic, resp.StatusCode, body)
		}
	}
	// TopicParam names the parameter; values are trimmed.
	ev := mustPublish(t, h, "lobby", 1)
	c := wiretest.Dial(t, srv.URL+"?room=%20lobby%20&topic=ignored", wiretest.LastID(0))
	if _, topic, _, _ := c.Hello(); topic == nil || *topic != "lobby" {
		t.Fatalf("topic %v", topic)
	}
	if f := c.Next(); f.ID != fmt.Sprint(ev.Sequence) {
		t.Fatalf("got %+v", f)
	}
	// A blank topic is a global connection.
	g := wiretest.Dial(t, srv.URL+"?room=%20%20", nil)
	if _, topic, _, _ := g.Hello(); topic != nil {
		t.Fatalf("blank topic gave %q", *topic)
	}
}

// The bad-input table, row by row, over HTTP.
func testSSEBadInputTable(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 1}})
	srv := serve(t, h)
	for range 3 {
		mustPublish(t, h, "a", 1)
	}
	// Retention deletes the first event (by count: on every store, without
	// waiting for the clock), so a cursor below it is a pruned one.
	if n, err := h.Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 2}); err != nil || n != 1 {
		t.Fatalf("prune %d, %v", n, err)
	}
	status := func(method, query string, header http.Header) int {
		req, _ := http.NewRequest(method, srv.URL+query, nil)
		for k, v := range header {
			req.Header[k] = v
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := status("DELETE", "", nil); s != 405 {
		t.Errorf("method: %d", s)
	}
	if s := status("GET", "", http.Header{"Origin": {"http://evil.example"}}); s != 403 {
		t.Errorf("origin: %d", s)
	}
	if s := status("GET", "?topic=%00", nil); s != 400 {
		t.Errorf("topic: %d", s)
	}
	for cursor, reason := range map[string]string{"x": "invalid_cursor", "-3": "invalid_cursor", "2.5": "invalid_cursor",
		"18446744073709551616": "invalid_cursor", "50": "unknown_cursor", "0": "pruned"} {
		c := wiretest.Dial(t, srv.URL+"?topic=a", http.Header{"Last-Event-ID": {cursor}})
		c.Hello()
		if g := wiretest.MustGap(t, c.Next()); g.Reason != reason {
			t.Errorf("cursor %q: gap %s, want %s", cursor, g.String(), reason)
		}
		c.Close()
	}
}

// The stream works over HTTP/2 (TLS), where flushing and write deadlines
// go through the HTTP/2 server's own writer.
func testSSEOverHTTP2(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := httptest.NewUnstartedServer(h.Handler())
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	first := mustPublish(t, h, "a", 1)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"?topic=a", nil)
	req.Header.Set("Last-Event-ID", "0")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 {
		t.Fatalf("%s %d", resp.Proto, resp.StatusCode)
	}
	frames := make(chan frame, 16)
	done := make(chan error, 1)
	go func() { done <- wiretest.ReadFrames(resp.Body, frames) }()
	next := func() frame {
		t.Helper()
		select {
		case f := <-frames:
			return f
		case <-time.After(waitFor):
			t.Fatal("no frame over HTTP/2")
			return frame{}
		}
	}
	if f := next(); f.Event != "hello" {
		t.Fatalf("first frame %+v", f)
	}
	if f := next(); f.ID != fmt.Sprint(first.Sequence) {
		t.Fatalf("replayed %+v", f)
	}
	ev := mustPublish(t, h, "a", 2)
	if f := next(); f.ID != fmt.Sprint(ev.Sequence) {
		t.Fatalf("live %+v", f)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("reader did not stop")
	}
}
