package hubtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// The gap matrix of PROTOCOL.md for replay_limit, in a topic scope and the global
// scope, with other topics interleaved so counting visible rows and
// sequence arithmetic disagree.
func testSSEGapReplayLimit(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 3}})
	srv := serve(t, h)
	// Relative to the head b: 1:a 2:x 3:a 4:bcast 5:x 6:a 7:x 8:a 9:a 10:x
	b := headOf(t, h)
	publishTopics(t, h, "a", "x", "a", "", "x", "a", "x", "a", "a", "x")
	cases := []struct {
		name     string
		url      string
		cursor   int64
		from     int64
		through  int64
		missed   int64
		replayed []string
	}{
		// Visible to a above 1: 3,4,6,8,9. Window 6,8,9; missed 3,4.
		{"topic", "?topic=a", 1, 3, 4, 2, []string{"6", "8", "9"}},
		// Visible above the head b (0 is the same): 1..10. Window 8,9,10; missed 1..7.
		{"global", "", 0, 1, 7, 7, []string{"8", "9", "10"}},
		// Visible to x above 2: 4,5,7,10. Window 5,7,10; missed 4.
		{"topic one missed", "?topic=x", 2, 4, 4, 1, []string{"5", "7", "10"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cur := b + tc.cursor
			if tc.cursor == 0 {
				cur = 0
			}
			c := wiretest.Dial(t, srv.URL+tc.url, wiretest.LastID(cur))
			_, _, cursor, head := c.Hello()
			if cursor != cur || head != b+10 {
				t.Fatalf("hello cursor %d head %d", cursor, head)
			}
			g := wiretest.MustGap(t, c.Next())
			want := gapJSON{Reason: "replay_limit", ResumedFrom: i64p(cur), MissedFrom: i64p(b + tc.from),
				MissedThrough: i64p(b + tc.through), Missed: i64p(tc.missed), ReplayLimit: 3}
			if g.String() != want.String() {
				t.Fatalf("gap %s, want %s", g.String(), want.String())
			}
			if got := wiretest.FrameIDs(c.Events(3)); !slices.Equal(got, relIDs(b, atoi(t, tc.replayed)...)) {
				t.Fatalf("replayed %v, want %v", got, tc.replayed)
			}
		})
	}
	// Exactly at the limit: no gap.
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(b+4))
	c.Hello()
	if got := wiretest.FrameIDs(c.Events(3)); !slices.Equal(got, relIDs(b, 6, 8, 9)) {
		t.Fatalf("at the limit: %v", got)
	}
}

// A negative ReplayLimit replays nothing: any backlog is a gap.
func testSSEGapNegativeReplayLimit(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: -1}})
	srv := serve(t, h)
	b := headOf(t, h)
	publishTopics(t, h, "a", "b", "a")
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0))
	c.Hello()
	g := wiretest.MustGap(t, c.Next())
	want := gapJSON{Reason: "replay_limit", ResumedFrom: i64p(0), MissedFrom: i64p(b + 1), MissedThrough: i64p(b + 3), Missed: i64p(2), ReplayLimit: 0}
	if g.String() != want.String() {
		t.Fatalf("gap %s", g.String())
	}
	// Nothing is replayed, and the missed events never arrive later.
	ev := mustPublish(t, h, "a", "live")
	c.NextIs(ev.Sequence, "after the gap")
	// Caught up: no gap.
	c = wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(ev.Sequence))
	c.Hello()
	ev = mustPublish(t, h, "a", "live")
	c.NextIs(ev.Sequence, "caught up")
}

func testSSEGapPruned(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: 2}})
	srv := serve(t, h)
	ctx := context.Background()
	// Relative to the head b: 1:a 2:b 3:a 4:b 5:b 6:b 7:a 8:b 9:b 10:b
	b := headOf(t, h)
	publishTopics(t, h, "a", "b", "a", "b", "b", "b", "a", "b", "b", "b")
	// Delete 1..5: watermarks a=3, b=5.
	if n, err := h.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 5}); err != nil || n != 5 {
		t.Fatalf("prune %d, %v", n, err)
	}
	cases := []struct {
		name     string
		url      string
		cursor   int64
		want     *gapJSON
		replayed []string
	}{
		// a above 1: 3 pruned (P_a=3 > 1); retained 7; window 7. Gap 2..3.
		{"topic pruned", "?topic=a", 1, &gapJSON{Reason: "pruned", ResumedFrom: i64p(1), MissedFrom: i64p(2), MissedThrough: i64p(3), ReplayLimit: 2}, []string{"7"}},
		// a above 3: nothing of a was pruned above 3; b's pruning does not matter.
		{"other topic pruned", "?topic=a", 3, nil, []string{"7"}},
		// b above 4: P_b=5 > 4; retained 6,8,9,10; window 9,10; M = 6,8.
		// missedThrough = max(P, last of M) = 8.
		{"pruned and over the limit", "?topic=b", 4, &gapJSON{Reason: "pruned", ResumedFrom: i64p(4), MissedFrom: i64p(5), MissedThrough: i64p(8), ReplayLimit: 2}, []string{"9", "10"}},
		// Global above 4: any topic's watermark (5) applies.
		{"global", "", 4, &gapJSON{Reason: "pruned", ResumedFrom: i64p(4), MissedFrom: i64p(5), MissedThrough: i64p(8), ReplayLimit: 2}, []string{"9", "10"}},
		// Global above 5: nothing pruned above; over the limit only.
		{"global above watermark", "", 5, &gapJSON{Reason: "replay_limit", ResumedFrom: i64p(5), MissedFrom: i64p(6), MissedThrough: i64p(8), Missed: i64p(3), ReplayLimit: 2}, []string{"9", "10"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := wiretest.Dial(t, srv.URL+tc.url, wiretest.LastID(b+tc.cursor))
			if _, _, cursor, _ := c.Hello(); cursor != b+tc.cursor {
				t.Fatalf("cursor %d", cursor)
			}
			if tc.want != nil {
				want := *tc.want
				for _, p := range []**int64{&want.ResumedFrom, &want.MissedFrom, &want.MissedThrough} {
					*p = i64p(b + **p)
				}
				if g := wiretest.MustGap(t, c.Next()); g.String() != want.String() {
					t.Fatalf("gap %s, want %s", g.String(), want.String())
				}
			}
			if got := wiretest.FrameIDs(c.Events(len(tc.replayed))); !slices.Equal(got, relIDs(b, atoi(t, tc.replayed)...)) {
				t.Fatalf("replayed %v, want %v", got, tc.replayed)
			}
		})
	}
	// Broadcasts' watermark applies to every topic.
	mustPublish(t, h, "", "bcast") // 11
	mustPublish(t, h, "c", "c")    // 12
	if _, err := h.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 1}); err != nil {
		t.Fatal(err)
	}
	c := wiretest.Dial(t, srv.URL+"?topic=c", wiretest.LastID(b+10))
	c.Hello()
	g := wiretest.MustGap(t, c.Next())
	if g.Reason != "pruned" || *g.MissedFrom != b+11 || *g.MissedThrough != b+11 || g.Missed != nil {
		t.Fatalf("gap %s", g.String())
	}
}

// A cursor above the head (the log was reset) is an unknown_cursor gap; the
// client is then fresh from the head and gets live events at once.
func testSSEGapUnknownCursor(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	ev1 := mustPublish(t, h, "a", 1)
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(ev1.Sequence+1000))
	f, _, cursor, head := c.Hello()
	if cursor != ev1.Sequence || head != ev1.Sequence || f.ID != fmt.Sprint(ev1.Sequence) {
		t.Fatalf("hello %+v", f)
	}
	g := wiretest.MustGap(t, c.Next())
	if want := (gapJSON{Reason: "unknown_cursor", ResumedFrom: i64p(ev1.Sequence + 1000), ReplayLimit: 100}); g.String() != want.String() {
		t.Fatalf("gap %s", g.String())
	}
	ev := mustPublish(t, h, "a", 2)
	c.NextIs(ev.Sequence, "not live from the head")
}

func testSSEGapInvalidCursor(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: -5}})
	srv := serve(t, h)
	mustPublish(t, h, "a", 1)
	for _, bad := range []string{"abc", "-1", "1.5", "+1", " 1", "1 ", "1e3", "0x10", "9223372036854775808", "99999999999999999999"} {
		t.Run(bad, func(t *testing.T) {
			// Header values cannot hold every byte; the query parameter
			// carries the same cursor rules.
			head, _ := h.LatestSequence(context.Background())
			c := wiretest.Dial(t, srv.URL+"?topic=a&lastEventId="+url.QueryEscape(bad), nil)
			if _, _, cursor, _ := c.Hello(); cursor != head {
				t.Fatalf("cursor %d, want the head %d", cursor, head)
			}
			g := wiretest.MustGap(t, c.Next())
			if want := (gapJSON{Reason: "invalid_cursor", ReplayLimit: 0}); g.String() != want.String() {
				t.Fatalf("gap %s", g.String())
			}
			ev := mustPublish(t, h, "a", 2)
			c.NextIs(ev.Sequence, "not live")
		})
	}
	// The largest valid cursor is valid, and above the head.
	c := wiretest.Dial(t, srv.URL+"?topic=a", http.Header{"Last-Event-ID": {"9223372036854775807"}})
	c.Hello()
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "unknown_cursor" {
		t.Fatalf("gap %s", g.String())
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

// Rows another process committed and retention deleted before this hub
// could deliver them live cannot be delivered: the hub ends its streams so
// that their clients reconnect and get a gap, instead of a silent hole.
func testSSEResyncWhenRowsPrunedBeforeLiveDelivery(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	other := open(replayd.Options{})

	c := wiretest.Dial(t, srv.URL, nil)
	_, _, cursor, _ := c.Hello()
	// Three events committed by "another process" (h has no tail), and
	// deleted by retention, all three.
	publishThenPruneAll(t, other, "", 3, 3)
	ev := mustPublish(t, h, "", "next") // h learns of the gap now
	if f, err := c.NextErr(waitFor); err == nil {
		t.Fatalf("stream went on with %+v (the next event is %d): a silent hole", f, ev.Sequence)
	} else if errors.Is(err, wiretest.ErrTimeout) {
		t.Fatal("stream neither ended nor delivered")
	}
	// Reconnecting from the last id it saw, the client is told.
	c = wiretest.Dial(t, srv.URL, wiretest.LastID(cursor))
	c.Hello()
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "pruned" || *g.MissedFrom != cursor+1 || *g.MissedThrough != cursor+3 {
		t.Fatalf("gap %s", g.String())
	}
	c.NextIs(ev.Sequence, "after the gap")
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
