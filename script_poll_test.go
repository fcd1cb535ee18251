package replayd

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/headless"
)

// The module's poll transport and its "auto" fallback, in Chromium.

// clientPollHandler is the poll endpoint the module's browser tests use.
func clientPollHandler(h *EventHub) http.Handler { return h.PollHandler() }

// clientPollGate wraps a poll endpoint: it records every request, can
// answer the next ones with an error status instead (503 with Retry-After:
// 1), and counts the requests being served.
type clientPollGate struct {
	next http.Handler

	mu     sync.Mutex // guards the fields below
	faults []int      // statuses for the next requests, in order
	reqs   []clientPollRequest
	served []clientPollRequest // those passed on, with the endpoint's status
	active int                 // requests being served
}

// clientPollRequest is what the gate saw of one request.
type clientPollRequest struct {
	Cursor string // the cursor parameter; "" when absent
	Wait   string // the wait parameter
	At     time.Time
	Status int // the fault answered, or 200 when passed on
}

func (g *clientPollGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := clientPollRequest{Cursor: q.Get("cursor"), Wait: q.Get("wait"), At: time.Now(), Status: http.StatusOK}
	g.mu.Lock()
	if len(g.faults) > 0 {
		req.Status, g.faults = g.faults[0], g.faults[1:]
	}
	g.reqs = append(g.reqs, req)
	g.active++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.active--
		g.mu.Unlock()
	}()
	if req.Status != http.StatusOK {
		if req.Status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, http.StatusText(req.Status), req.Status)
		return
	}
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	g.next.ServeHTTP(sw, r)
	g.mu.Lock()
	g.served = append(g.served, clientPollRequest{Cursor: req.Cursor, Wait: req.Wait, At: req.At, Status: sw.status})
	g.mu.Unlock()
}

// statusWriter records the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// answered returns the requests passed on, with the status the endpoint
// answered, in the order they ended.
func (g *clientPollGate) answered() []clientPollRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]clientPollRequest(nil), g.served...)
}

func (g *clientPollGate) requests() []clientPollRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]clientPollRequest(nil), g.reqs...)
}

func (g *clientPollGate) serving() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.active
}

// waitServing waits until the gate serves n requests at once.
func (g *clientPollGate) waitServing(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(browserWait)
	for g.serving() != n {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d poll requests in flight, have %d", n, g.serving())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Over polls, from cursor 0 with a backlog of 260 events: a 503 and a 500
// first, then pages of 100 passing each answer's cursor back at once
// (wait=0 while more is owed), then long polls of 25 s woken by live
// publishes. Every visible event of the asked types reaches onEvent once, in
// order, with its topic (null for a broadcast).
func clientTestPollOnceInOrder(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, browserOptions())
	var want, visible []Event // visible: what the server sends, skipped types included
	for i := range 260 {
		switch {
		case i%50 == 7:
			want = append(want, mustPublish(t, h, "", map[string]int{"broadcast": i}))
		case i%30 == 11:
			mustPublish(t, h, "other", map[string]int{"other": i})
			continue
		case i%40 == 13:
			visible = append(visible, mustPublish(t, h, "room", map[string]int{"skipped": i}, WithType("skipped")))
			continue
		default:
			want = append(want, mustPublish(t, h, "room", map[string]int{"n": i}, WithType([]string{"message", "chat"}[i%2])))
		}
		visible = append(visible, want[len(want)-1])
	}
	gate := &clientPollGate{next: clientPollHandler(h), faults: []int{http.StatusServiceUnavailable, http.StatusInternalServerError}}
	srv := browserListen(t, "127.0.0.1:0", clientMux(nil, gate))

	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{
		"poll": "/poll", "topics": []string{"room"}, "cursor": 0, "storageKey": "k", "types": []string{"message", "chat"},
	}, "")
	clientWaitEvents(t, tab, "k", len(want))
	gate.waitServing(t, 1) // a long poll waits
	for i := range 3 {
		want = append(want, mustPublish(t, h, "room", map[string]int{"live": i}))
		clientWaitEvents(t, tab, "k", len(want))
	}
	want = append(want, mustPublish(t, h, "", map[string]string{"broadcast": "live"}))
	st := clientWaitEvents(t, tab, "k", len(want))
	clientAssertEvents(t, st, want, "poll")
	if last := want[len(want)-1].Sequence; *st.Cursor != last || *st.Stored != strconv.FormatInt(last, 10) {
		t.Fatalf("cursor %d, stored %s; want %d", *st.Cursor, *st.Stored, last)
	}

	reqs := gate.requests()
	if len(reqs) < 6 || reqs[0].Status != 503 || reqs[1].Status != 500 {
		t.Fatalf("requests %+v", reqs)
	}
	if d := reqs[1].At.Sub(reqs[0].At); d < 900*time.Millisecond {
		t.Fatalf("the poll after a 503 with Retry-After: 1 came %v later", d)
	}
	// The pages of 100: cursor 0, then each answer's cursor, at once while more
	// is owed, then long polls.
	wantReqs := [][2]string{{"0", "25"}, {"0", "25"}, {"0", "25"}}
	for _, i := range []int{99, 199} {
		wantReqs = append(wantReqs, [2]string{strconv.FormatInt(visible[i].Sequence, 10), "0"})
	}
	for i, w := range wantReqs {
		if got := [2]string{reqs[i].Cursor, reqs[i].Wait}; got != w {
			t.Fatalf("request %d: cursor, wait = %v, want %v; requests %+v", i, got, w, reqs)
		}
	}
	if r := reqs[len(wantReqs)]; r.Wait != "25" {
		t.Fatalf("after the last page the module asked wait=%s, want 25", r.Wait)
	}
}

// A cursor above the head (the log was replaced): onGap gets the
// unknown_cursor gap first, and the events after it (with lower ids than
// the old cursor) are passed on, over either transport.
func clientTestUnknownCursor(t *testing.T, browser context.Context, transport string) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, browserOptions())
	mustPublish(t, h, "room", "old")
	srv := browserListen(t, "127.0.0.1:0", clientMux(h.Handler(), clientPollHandler(h)))

	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{
		"sse": "/events", "poll": "/poll", "transport": transport, "topics": []string{"room"}, "cursor": 1000000,
	}, "")
	clientWaitUntil(t, tab, "", "the gap", func(st clientPageState) bool { return len(st.Rec) > 0 })
	want := []Event{mustPublish(t, h, "room", "new 1"), mustPublish(t, h, "", "new 2")}
	st := clientWaitEvents(t, tab, "", len(want))
	if len(st.Rec) != 3 || st.Rec[0].Kind != "gap" {
		t.Fatalf("want the gap, then 2 events: %+v", st.Rec)
	}
	var g gapJSON
	if err := json.Unmarshal([]byte(st.Rec[0].Data), &g); err != nil || g.Reason != reasonUnknownCursor || g.ResumedFrom == nil || *g.ResumedFrom != 1000000 {
		t.Fatalf("gap %s (%v), want unknown_cursor resumed from 1000000", st.Rec[0].Data, err)
	}
	st.Rec = st.Rec[1:]
	clientAssertEvents(t, st, want, transport)
}

// "auto" falls back to polls, keeping the cursor: when the SSE URL is
// unusable (404: three attempts without a hello), when there is no
// EventSource, and when a working stream's reconnect hangs (no hello within
// 10 s) while events are published.
func clientTestAutoFallback(t *testing.T, browser context.Context) {
	for _, tc := range []struct {
		name, sse           string
		noEventSource, hang bool
	}{
		{name: "SSEUnusable", sse: "/nowhere"},
		{name: "NoEventSource", sse: "/events", noEventSource: true},
		{name: "ReconnectHangs", sse: "/events", hang: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, _ := openTestDB(t)
			h := newTestHub(t, db, browserOptions())
			want := []Event{mustPublish(t, h, "room", "backlog 1"), mustPublish(t, h, "room", "backlog 2")}
			sse := newBrowserGate(h.Handler())
			poll := &clientPollGate{next: clientPollHandler(h)}
			srv := browserListen(t, "127.0.0.1:0", clientMux(sse, poll))
			opts := map[string]any{"sse": tc.sse, "poll": "/poll", "topics": []string{"room"}, "cursor": 0, "storageKey": "k"}
			if tc.noEventSource {
				opts["noEventSource"] = true
			}

			tab := browserTab(t, browser)
			clientNavigate(t, tab, srv.url(), opts, "")
			clientWaitEvents(t, tab, "k", len(want))
			if tc.hang {
				// The stream works; then it is dropped and its reconnects hang.
				want = append(want, mustPublish(t, h, "room", "live over SSE"))
				clientWaitEvents(t, tab, "k", len(want))
				if len(poll.requests()) != 0 {
					t.Fatalf("polled while SSE works: %+v", poll.requests())
				}
				sse.hold()
				sse.dropAll()
				browserWaitNoClients(t, h)
				want = append(want, mustPublish(t, h, "room", "while the stream hangs"))
				defer sse.release()
			}
			poll.waitServing(t, 1)
			want = append(want, mustPublish(t, h, "room", "live over polls"))
			st := clientWaitEvents(t, tab, "k", len(want))
			clientAssertEvents(t, st, want, "any")
			sseGets := 0
			for _, r := range sse.requests() {
				if r.Method == http.MethodGet {
					sseGets++
				}
			}
			if tc.noEventSource && sseGets != 0 {
				t.Fatalf("%d SSE requests without EventSource", sseGets)
			}
			// The polls start from the cursor SSE reached.
			first := "0"
			if tc.hang {
				first = strconv.FormatInt(want[2].Sequence, 10)
			}
			if got := poll.requests()[0].Cursor; got != first {
				t.Fatalf("the first poll's cursor %s, want %s", got, first)
			}
		})
	}
}

// close() ends everything: the in-flight long poll is aborted (the server
// sees the request end), no request follows, and nothing more reaches
// onEvent; over SSE the stream ends.
func clientTestClose(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, browserOptions())
	poll := &clientPollGate{next: clientPollHandler(h)}
	srv := browserListen(t, "127.0.0.1:0", clientMux(h.Handler(), poll))
	for _, transport := range []string{"poll", "sse"} {
		tab := browserTab(t, browser)
		clientNavigate(t, tab, srv.url(), map[string]any{"sse": "/events", "poll": "/poll", "transport": transport, "topics": []string{"room"}}, "")
		clientWaitCursor(t, tab, "")
		want := []Event{mustPublish(t, h, "room", transport)}
		clientWaitEvents(t, tab, "", 1)
		if transport == "poll" {
			poll.waitServing(t, 1)
		}
		ctx, cancel := context.WithTimeout(tab, browserWait)
		_, err := headless.Evaluate[any](ctx, `window.sub.close()`)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		before := len(poll.requests())
		poll.waitServing(t, 0)
		browserWaitNoClients(t, h)
		mustPublish(t, h, "room", "after close")
		// Nothing can arrive, so there is no signal to wait for: give a
		// mistaken timer or listener time to show itself.
		time.Sleep(500 * time.Millisecond)
		st := clientWaitCursor(t, tab, "")
		clientAssertEvents(t, st, want, transport)
		if n := len(poll.requests()); n != before {
			t.Fatalf("%s: %d poll requests after close", transport, n-before)
		}
	}
}
