package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/headless"
	"github.com/replayd/replayd/internal/wiretest"
)

// Browser end-to-end tests: a real headless Chromium EventSource against
// real net/http listeners on 127.0.0.1. Each scenario asserts the page's
// own record of what its EventSource delivered (e.lastEventId, e.type,
// e.data), which the test reads back with headless.Evaluate.
//
// The tests skip when Chromium is absent, unless REPLAYD_BROWSER_TESTS=1,
// which turns a missing browser into a failure (CI sets it).

// browserWait bounds every wait on the browser.
const browserWait = 20 * time.Second

// browserStartWait bounds Chromium's start. It is longer than browserWait:
// in a plain `go test ./...` other packages' tests share the machine's
// cores, and a cold Chromium was seen to need over 20 s there.
const browserStartWait = 60 * time.Second

// browserRetry is the SSE retry the tests' hubs send, so the browser
// reconnects quickly.
const browserRetry = 200 * time.Millisecond

// browserPageHTML records every event its EventSource delivers. The query
// parameter src is the SSE URL; types lists the event types to listen to.
const browserPageHTML = `<!doctype html>
<meta charset="utf-8">
<title>replayd browser test</title>
<script>
"use strict";
const q = new URLSearchParams(location.search);
window.rec = [];
window.opens = 0;
window.errors = 0;
const es = new EventSource(q.get("src"));
window.es = es;
const record = e => window.rec.push({id: e.lastEventId, type: e.type, data: e.data});
for (const t of (q.get("types") || "hello,gap,message").split(",")) {
  es.addEventListener(t, record);
}
es.onopen = () => { window.opens++; };
es.onerror = () => { window.errors++; };
</script>
`

// browserRecord is one event as the page's EventSource delivered it.
type browserRecord struct {
	ID   string `json:"id"`   // e.lastEventId
	Type string `json:"type"` // e.type
	Data string `json:"data"` // e.data
}

// browserPageState is the page's record and its EventSource's state.
type browserPageState struct {
	Rec        []browserRecord `json:"rec"`
	Opens      int             `json:"opens"`
	Errors     int             `json:"errors"`
	ReadyState int             `json:"readyState"`
}

// events returns the records that are published events: neither hello nor
// gap.
func (s browserPageState) events() []browserRecord {
	var out []browserRecord
	for _, r := range s.Rec {
		if r.Type != "hello" && r.Type != "gap" {
			out = append(out, r)
		}
	}
	return out
}

// ofType returns the records of type typ.
func (s browserPageState) ofType(typ string) []browserRecord {
	var out []browserRecord
	for _, r := range s.Rec {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	return out
}

// browserStart starts one headless Chromium for the test and its subtests
// and stops it, and its processes, at the end.
func browserStart(t *testing.T) context.Context {
	t.Helper()
	execPath := headless.ExecPath(t)
	dataDir := filepath.Join(t.TempDir(), "chromium-profile")
	// Registered before the browser's cleanup, so it runs after it: the
	// profile is removed once the browser is gone, retrying while its
	// child processes finish writing, before t.TempDir's own cleanup.
	t.Cleanup(func() { browserRemoveAll(t, dataDir) })
	ctx, stop, err := headless.Start(execPath, dataDir, t.Logf, browserStartWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ctx
}

// browserRemoveAll removes dir, retrying for a few seconds while the
// browser's last child processes write in it.
func browserRemoveAll(t *testing.T, dir string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := os.RemoveAll(dir)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("remove the Chromium profile: %v", err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// browserTab opens a tab in a fresh browser context (no shared cache,
// cookies or connections) and closes it at the end of the test.
func browserTab(t *testing.T, browser context.Context) context.Context {
	t.Helper()
	ctx, cancel, err := headless.NewTab(browser, browserWait)
	if err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	t.Cleanup(cancel)
	return ctx
}

// browserNavigate loads the recording page at pageURL, listening on src
// for the given event types.
func browserNavigate(t *testing.T, tab context.Context, pageURL, src string, types ...string) {
	t.Helper()
	if len(types) == 0 {
		types = []string{"hello", "gap", "message"}
	}
	u := pageURL + "?" + url.Values{"src": {src}, "types": {strings.Join(types, ",")}}.Encode()
	ctx, cancel := context.WithTimeout(tab, browserWait)
	defer cancel()
	if err := headless.Navigate(ctx, u); err != nil {
		t.Fatalf("navigate to %s: %v", u, err)
	}
}

// browserState reads the page's record.
func browserState(t *testing.T, tab context.Context) browserPageState {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 5*time.Second)
	defer cancel()
	st, err := headless.Evaluate[browserPageState](ctx,
		`({rec: window.rec || [], opens: window.opens || 0, errors: window.errors || 0,
		   readyState: window.es ? window.es.readyState : -1})`)
	if err != nil {
		t.Fatalf("read the page's record: %v", err)
	}
	return st
}

// browserWaitUntil polls the page's record until cond holds, for at most
// browserWait, and returns the record that satisfied it.
func browserWaitUntil(t *testing.T, tab context.Context, what string, cond func(browserPageState) bool) browserPageState {
	t.Helper()
	deadline := time.Now().Add(browserWait)
	for {
		st := browserState(t, tab)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; page record: %s", browserWait, what, browserDump(st))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// browserWaitEvents waits until the page holds n published events.
func browserWaitEvents(t *testing.T, tab context.Context, n int) browserPageState {
	t.Helper()
	return browserWaitUntil(t, tab, fmt.Sprintf("%d events", n), func(st browserPageState) bool {
		return len(st.events()) >= n
	})
}

// browserWaitHellos waits until the page holds n hello frames.
func browserWaitHellos(t *testing.T, tab context.Context, n int) browserPageState {
	t.Helper()
	return browserWaitUntil(t, tab, fmt.Sprintf("%d hello frames", n), func(st browserPageState) bool {
		return len(st.ofType("hello")) >= n
	})
}

func browserDump(st browserPageState) string {
	b, _ := json.MarshalIndent(st, "", "  ")
	return string(b)
}

// browserWaitNoClients waits until h serves no SSE connection, so that
// what is published next can only reach the page by replay.
func browserWaitNoClients(t *testing.T, h *EventHub) {
	t.Helper()
	deadline := time.Now().Add(browserWait)
	for h.Clients().Total() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the hub's streams to end: %+v", h.Clients().Snapshot())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// browserAssertEvents checks that the page received exactly want, in
// order: ids equal to the published sequences, types and data byte for
// byte.
func browserAssertEvents(t *testing.T, st browserPageState, want []Event) {
	t.Helper()
	got := st.events()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		w := want[i]
		ok = got[i] == browserRecord{ID: strconv.FormatInt(w.Sequence, 10), Type: w.Type, Data: string(w.Payload)}
	}
	if !ok {
		exp := make([]browserRecord, len(want))
		for i, w := range want {
			exp[i] = browserRecord{ID: strconv.FormatInt(w.Sequence, 10), Type: w.Type, Data: string(w.Payload)}
		}
		e, _ := json.MarshalIndent(exp, "", "  ")
		t.Fatalf("the page's events differ from what was published\nwant %s\npage record: %s", e, browserDump(st))
	}
	var last int64
	for _, r := range got {
		id, err := strconv.ParseInt(r.ID, 10, 64)
		if err != nil || id <= last {
			t.Fatalf("event ids are not strictly increasing at %q: %s", r.ID, browserDump(st))
		}
		last = id
	}
}

// browserHello parses a hello record.
func browserHello(t *testing.T, r browserRecord) (cursor, head int64) {
	t.Helper()
	var d struct {
		Cursor *int64 `json:"cursor"`
		Head   *int64 `json:"head"`
	}
	if r.Type != "hello" {
		t.Fatalf("record %+v is not a hello", r)
	}
	if err := json.Unmarshal([]byte(r.Data), &d); err != nil || d.Cursor == nil || d.Head == nil {
		t.Fatalf("hello data %q: %v", r.Data, err)
	}
	if r.ID != strconv.FormatInt(*d.Cursor, 10) {
		t.Fatalf("hello lastEventId %q differs from its cursor %d", r.ID, *d.Cursor)
	}
	return *d.Cursor, *d.Head
}

// browserServer is a real net/http server on a 127.0.0.1 listener.
type browserServer struct {
	srv  *http.Server
	addr string // host:port
	done chan struct{}
}

// browserListen serves h on addr ("127.0.0.1:0" for a fresh port). Listening
// again on a port a closed server used is retried for a few seconds. The
// server is closed at the end of the test if it is still open.
func browserListen(t *testing.T, addr string, h http.Handler) *browserServer {
	t.Helper()
	var ln net.Listener
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		ln, err = net.Listen("tcp", addr)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			t.Fatalf("listen on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s := &browserServer{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		addr: ln.Addr().String(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve %s: %v", s.addr, err)
		}
	}()
	t.Cleanup(s.close)
	return s
}

// close shuts the listener and every connection at once, the way a process
// that goes away would.
func (s *browserServer) close() {
	s.srv.Close()
	<-s.done
}

func (s *browserServer) url() string { return "http://" + s.addr }

func (s *browserServer) port() string {
	_, port, _ := net.SplitHostPort(s.addr)
	return port
}

// browserGate wraps an SSE handler. It records every request, can end the
// streams it serves (server side, like a proxy or a deploy would), and can
// hold new requests until released, so the test decides what is published
// while the page is away.
type browserGate struct {
	next http.Handler

	mu     sync.Mutex // guards the fields below
	reqs   []browserRequest
	active map[*http.Request]context.CancelFunc
	held   chan struct{} // non-nil while holding; closed on release
}

// browserRequest is what the gate saw of one request.
type browserRequest struct {
	Method      string
	Origin      string
	LastEventID string // the Last-Event-ID header
}

func newBrowserGate(next http.Handler) *browserGate {
	return &browserGate{next: next, active: make(map[*http.Request]context.CancelFunc)}
}

func (g *browserGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.reqs = append(g.reqs, browserRequest{Method: r.Method, Origin: r.Header.Get("Origin"), LastEventID: r.Header.Get("Last-Event-ID")})
	held := g.held
	g.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-r.Context().Done():
			return
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	r = r.WithContext(ctx)
	g.mu.Lock()
	g.active[r] = cancel
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.active, r)
		g.mu.Unlock()
	}()
	g.next.ServeHTTP(w, r)
}

// hold makes new requests wait until release.
func (g *browserGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil {
		g.held = make(chan struct{})
	}
}

// release lets held requests through.
func (g *browserGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held != nil {
		close(g.held)
		g.held = nil
	}
}

// dropAll ends every stream being served.
func (g *browserGate) dropAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cancel := range g.active {
		cancel()
	}
	// A detached stream outlives its request: end it on the hub.
	if sh, ok := g.next.(*sseHandler); ok && testDetach {
		h := (*EventHub)(sh)
		h.live.Resync()
	}
}

// requests returns what the gate has seen so far.
func (g *browserGate) requests() []browserRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]browserRequest(nil), g.reqs...)
}

// browserMux serves the recording page at /page and sse at /events.
func browserMux(sse http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/page", browserServePage)
	if sse != nil {
		mux.Handle("/events", sse)
	}
	return mux
}

func browserServePage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprint(w, browserPageHTML)
}

// browserOptions are the hub options of the browser tests: a quick retry
// and no heartbeats in the record.
func browserOptions() Options {
	return Options{SSE: SSEOptions{Retry: browserRetry, HeartbeatInterval: -1}}
}

// TestBrowser runs every browser scenario in one Chromium, each in its own
// tab and browser context.
func TestBrowser(t *testing.T) {
	browser := browserStart(t)
	t.Run("ProcessRestart", func(t *testing.T) { browserTestProcessRestart(t, browser) })
	t.Run("FreshPageSawOnlyHello", func(t *testing.T) { browserTestFreshPage(t, browser) })
	t.Run("CrossOrigin", func(t *testing.T) { browserTestCrossOrigin(t, browser) })
	t.Run("Gap", func(t *testing.T) { browserTestGap(t, browser) })
	t.Run("MultiLinePayload", func(t *testing.T) { browserTestMultiLine(t, browser) })
	t.Run("OverloadReconnect", func(t *testing.T) { browserTestOverload(t, browser) })
}

// TestBrowserDetached runs the browser scenarios with DetachConnections on.
func TestBrowserDetached(t *testing.T) {
	withDetach(t, TestBrowser)
}

// Process restart: the page has events; the server goes away (listener and
// every connection closed, hub closed); another hub on the same database
// file publishes meanwhile; a new hub on a new *sql.DB comes back on the
// same port. The browser reconnects by itself and ends with every event
// exactly once, in order, ids equal to the sequences, and no gap.
func browserTestProcessRestart(t *testing.T, browser context.Context) {
	db, path := openTestDB(t)
	hubA := newTestHub(t, db, browserOptions())
	before := []Event{
		mustPublish(t, hubA, "room", map[string]string{"msg": "before the page"}),
		mustPublish(t, hubA, "other", map[string]string{"msg": "other topic"}),
	}
	gateA := newBrowserGate(hubA.Handler())
	srvA := browserListen(t, "127.0.0.1:0", browserMux(gateA))

	tab := browserTab(t, browser)
	browserNavigate(t, tab, srvA.url()+"/page", "/events?topic=room", "hello", "gap", "message", "chat")
	st := browserWaitHellos(t, tab, 1)
	if cursor, _ := browserHello(t, st.Rec[0]); cursor != before[1].Sequence {
		t.Fatalf("fresh hello cursor %d, want the head %d", cursor, before[1].Sequence)
	}

	var want []Event
	want = append(want,
		mustPublish(t, hubA, "room", map[string]int{"n": 1}),
		mustPublish(t, hubA, "room", map[string]int{"n": 2}, WithType("chat")),
		mustPublish(t, hubA, "", map[string]string{"broadcast": "live"}),
	)
	browserWaitEvents(t, tab, len(want))

	// The process goes away.
	srvA.close()
	if err := hubA.Close(); err != nil {
		t.Fatal(err)
	}

	// Another process publishes on the same file meanwhile.
	hubB := secondHub(t, path, Options{})
	want = append(want, mustPublish(t, hubB, "room", map[string]int{"n": 3}))
	mustPublish(t, hubB, "other", map[string]int{"n": 99}) // invisible to the page
	want = append(want,
		mustPublish(t, hubB, "", map[string]string{"broadcast": "while down"}),
		mustPublish(t, hubB, "room", map[string]int{"n": 4}, WithType("chat")),
	)
	if err := hubB.Close(); err != nil {
		t.Fatal(err)
	}

	// A new process comes back on the same port.
	hubC := secondHub(t, path, browserOptions())
	gateC := newBrowserGate(hubC.Handler())
	browserListen(t, "127.0.0.1:"+srvA.port(), browserMux(gateC))

	browserWaitEvents(t, tab, len(want))
	want = append(want, mustPublish(t, hubC, "room", map[string]int{"n": 5})) // live after the restart
	st = browserWaitEvents(t, tab, len(want))

	browserAssertEvents(t, st, want)
	if gaps := st.ofType("gap"); len(gaps) != 0 {
		t.Fatalf("unexpected gap after a complete resume: %s", browserDump(st))
	}
	hellos := st.ofType("hello")
	if len(hellos) != 2 {
		t.Fatalf("want 2 hello frames (first connect, resume), got %d: %s", len(hellos), browserDump(st))
	}
	if cursor, _ := browserHello(t, hellos[1]); cursor != want[2].Sequence {
		t.Fatalf("resume hello cursor %d, want the last event seen before the restart, %d", cursor, want[2].Sequence)
	}
	if !browserSawLastEventID(gateC.requests(), want[2].Sequence) {
		t.Fatalf("the new server got no reconnect with Last-Event-ID %d: %+v", want[2].Sequence, gateC.requests())
	}
	if st.Opens < 2 {
		t.Fatalf("the EventSource opened %d times, want at least 2", st.Opens)
	}
}

func browserSawLastEventID(reqs []browserRequest, seq int64) bool {
	for _, r := range reqs {
		if r.Method == http.MethodGet && r.LastEventID == strconv.FormatInt(seq, 10) {
			return true
		}
	}
	return false
}

// Fresh page that saw nothing yet: the page connects and receives only the
// hello; the server drops it (listener and connections closed); events are
// published; the server returns on the same port. The browser resumes from
// the hello's id and receives them all, and nothing from before it joined.
func browserTestFreshPage(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, browserOptions())
	mustPublish(t, h, "room", "old 1")
	head := mustPublish(t, h, "room", "old 2")
	gate := newBrowserGate(h.Handler())
	srv := browserListen(t, "127.0.0.1:0", browserMux(gate))

	tab := browserTab(t, browser)
	browserNavigate(t, tab, srv.url()+"/page", "/events?topic=room")
	st := browserWaitHellos(t, tab, 1)
	if len(st.Rec) != 1 {
		t.Fatalf("a fresh page should have only the hello: %s", browserDump(st))
	}
	if cursor, _ := browserHello(t, st.Rec[0]); cursor != head.Sequence {
		t.Fatalf("hello cursor %d, want the head %d", cursor, head.Sequence)
	}

	srv.close()
	if testDetach {
		gate.dropAll() // http.Server.Close does not reach detached streams
	}
	browserWaitNoClients(t, h)
	want := []Event{
		mustPublish(t, h, "room", "new 1"),
		mustPublish(t, h, "", "new broadcast"),
		mustPublish(t, h, "room", "new 2"),
	}
	gate2 := newBrowserGate(h.Handler())
	browserListen(t, "127.0.0.1:"+srv.port(), browserMux(gate2))

	st = browserWaitEvents(t, tab, len(want))
	browserAssertEvents(t, st, want)
	if len(st.ofType("gap")) != 0 {
		t.Fatalf("unexpected gap: %s", browserDump(st))
	}
	if !browserSawLastEventID(gate2.requests(), head.Sequence) {
		t.Fatalf("no reconnect carried the hello's id %d as Last-Event-ID: %+v", head.Sequence, gate2.requests())
	}
}

// Cross-origin: the page is on http://127.0.0.1:P1, the stream on
// http://localhost:P2, and AllowedOrigins is exactly the page's origin. The
// reconnect carrying Last-Event-ID is accepted and the resume is complete.
// The same page on another origin is refused.
func browserTestCrossOrigin(t *testing.T, browser context.Context) {
	pageSrv := browserListen(t, "127.0.0.1:0", browserMux(nil))
	origin := pageSrv.url()

	db, _ := openTestDB(t)
	opts := browserOptions()
	opts.SSE.AllowedOrigins = []string{origin}
	h := newTestHub(t, db, opts)
	gate := newBrowserGate(h.Handler())
	sseSrv := browserListen(t, "127.0.0.1:0", browserMux(gate))
	src := "http://localhost:" + sseSrv.port() + "/events?topic=room"

	tab := browserTab(t, browser)
	browserNavigate(t, tab, origin+"/page", src)
	browserWaitHellos(t, tab, 1)
	want := []Event{
		mustPublish(t, h, "room", map[string]int{"n": 1}),
		mustPublish(t, h, "room", map[string]int{"n": 2}),
	}
	browserWaitEvents(t, tab, len(want))

	// Drop the stream server side and publish while the page is away.
	gate.hold()
	gate.dropAll()
	browserWaitNoClients(t, h)
	want = append(want, mustPublish(t, h, "room", map[string]int{"n": 3}))
	mustPublish(t, h, "other", map[string]int{"n": 99}) // invisible to the page
	want = append(want, mustPublish(t, h, "room", map[string]int{"n": 4}))
	gate.release()

	st := browserWaitEvents(t, tab, len(want))
	browserAssertEvents(t, st, want)
	if len(st.ofType("gap")) != 0 {
		t.Fatalf("unexpected gap: %s", browserDump(st))
	}
	var resumed bool
	preflights := 0
	for _, r := range gate.requests() {
		if r.Origin != origin {
			t.Fatalf("request with Origin %q, want %q: %+v", r.Origin, origin, r)
		}
		switch r.Method {
		case http.MethodGet:
			resumed = resumed || r.LastEventID == strconv.FormatInt(want[1].Sequence, 10)
		case http.MethodOptions:
			preflights++
		}
	}
	if !resumed {
		t.Fatalf("no cross-origin reconnect carried Last-Event-ID %d: %+v", want[1].Sequence, gate.requests())
	}
	t.Logf("cross-origin requests: %+v (%d preflights)", gate.requests(), preflights)

	// Control: the same page served from an origin that is not allowed
	// (localhost instead of 127.0.0.1) gets 403, so its EventSource fails
	// for good without delivering anything.
	other := browserTab(t, browser)
	browserNavigate(t, other, "http://localhost:"+pageSrv.port()+"/page", src)
	st = browserWaitUntil(t, other, "the refused EventSource to close", func(st browserPageState) bool {
		return st.ReadyState == 2 // CLOSED
	})
	if len(st.Rec) != 0 {
		t.Fatalf("a page from a disallowed origin received events: %s", browserDump(st))
	}
}

// Gap: the page misses more than ReplayLimit events; on reconnect it sees
// one gap event with the right JSON, then exactly the newest window.
func browserTestGap(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	opts := browserOptions()
	opts.SSE.ReplayLimit = 3
	h := newTestHub(t, db, opts)
	gate := newBrowserGate(h.Handler())
	srv := browserListen(t, "127.0.0.1:0", browserMux(gate))

	tab := browserTab(t, browser)
	browserNavigate(t, tab, srv.url()+"/page", "/events?topic=room")
	browserWaitHellos(t, tab, 1)
	seen := mustPublish(t, h, "room", "seen")
	browserWaitEvents(t, tab, 1)

	gate.hold()
	gate.dropAll()
	browserWaitNoClients(t, h)
	var missed []Event
	for i := range 8 {
		missed = append(missed, mustPublish(t, h, "room", map[string]int{"missed": i}))
		if i%3 == 0 {
			mustPublish(t, h, "other", map[string]int{"invisible": i})
		}
	}
	gate.release()

	st := browserWaitEvents(t, tab, 1+3)
	want := append([]Event{seen}, missed[5:]...)
	browserAssertEvents(t, st, want)

	gaps := st.ofType("gap")
	if len(gaps) != 1 {
		t.Fatalf("want exactly one gap, got %d: %s", len(gaps), browserDump(st))
	}
	g := wiretest.MustGap(t, frame{Event: gaps[0].Type, Data: gaps[0].Data})
	wantGap := gapJSON{
		Reason:        reasonReplayLimit,
		ResumedFrom:   i64p(seen.Sequence),
		MissedFrom:    i64p(missed[0].Sequence),
		MissedThrough: i64p(missed[4].Sequence),
		Missed:        i64p(5),
		ReplayLimit:   3,
	}
	if gb, wb := mustJSON(g), mustJSON(wantGap); string(gb) != string(wb) {
		t.Fatalf("gap %s, want %s", gb, wb)
	}
	// A gap has no id: the page's cursor stays the resume hello's.
	if gaps[0].ID != strconv.FormatInt(seen.Sequence, 10) {
		t.Fatalf("gap lastEventId %q, want %d (the gap must not move the cursor)", gaps[0].ID, seen.Sequence)
	}
	// Order: hello, event, hello, gap, the newest window.
	var types []string
	for _, r := range st.Rec {
		types = append(types, r.Type)
	}
	if got, wantTypes := fmt.Sprint(types), "[hello message hello gap message message message]"; got != wantTypes {
		t.Fatalf("record types %s, want %s", got, wantTypes)
	}
}

// Multi-line payload: e.data equals the published JSON byte for byte, by
// replay and live alike.
func browserTestMultiLine(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, browserOptions())
	gate := newBrowserGate(h.Handler())
	srv := browserListen(t, "127.0.0.1:0", browserMux(gate))

	payloads := []string{
		"{\n  \"text\": \"first line\\nsecond line\",\n  \"nested\": {\n    \"list\": [1, 2, 3],\n\t\t\"unicode\": \"héllo wörld ✓ 🚀\"\n  }\n}",
		"[\n\n  \"a blank line above\",\n   \"data: not a field\",\n\"id: 99\",\n  \": not a comment\"  \n]\n",
		"{\"a\"\n:\n1,\"b\":\"event: x\"\n\n\n}",
	}
	want := []Event{mustPublish(t, h, "room", json.RawMessage(payloads[0]))} // replayed

	tab := browserTab(t, browser)
	browserNavigate(t, tab, srv.url()+"/page", "/events?topic=room&lastEventId=0")
	browserWaitEvents(t, tab, 1)
	for _, p := range payloads[1:] {
		want = append(want, mustPublish(t, h, "room", json.RawMessage(p))) // live
	}
	st := browserWaitEvents(t, tab, len(want))
	browserAssertEvents(t, st, want)
	for i, r := range st.events() {
		if r.Data != payloads[i] {
			t.Fatalf("payload %d: e.data %q, want %q", i, r.Data, payloads[i])
		}
	}
}

// Overload: the page's stream drops while another client holds the only
// connection slot, so its reconnects get the overload answer (200 with
// only a retry). Events are published while it is refused. Once the slot
// is free, the EventSource, reconnecting by itself, resumes from its
// cursor with every event it missed, in order, and no gap.
func browserTestOverload(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	opts := browserOptions()
	opts.SSE.MaxConnections = 1
	opts.SSE.OverloadRetry = 100 * time.Millisecond
	h := newTestHub(t, db, opts)
	gate := newBrowserGate(h.Handler())
	srv := browserListen(t, "127.0.0.1:0", browserMux(gate))

	tab := browserTab(t, browser)
	browserNavigate(t, tab, srv.url()+"/page", "/events?topic=room")
	browserWaitHellos(t, tab, 1)
	want := []Event{mustPublish(t, h, "room", map[string]int{"n": 1})}
	browserWaitEvents(t, tab, len(want))

	// Another client takes the only slot while the page is away.
	gate.hold()
	gate.dropAll()
	browserWaitNoClients(t, h)
	occupier := wiretest.Dial(t, serve(t, h).URL+"?topic=room", nil)
	if f, _, _, _ := occupier.Hello(); f.Retry == "" {
		t.Fatalf("hello %+v, want the retry in its block", f)
	}
	want = append(want, mustPublish(t, h, "room", map[string]int{"n": 2}))
	gate.release()

	// The page is refused, at least twice, and keeps trying.
	deadline := time.Now().Add(browserWait)
	for h.metrics.refusedOverload.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the page was not refused twice: %+v", gate.requests())
		}
		time.Sleep(10 * time.Millisecond)
	}
	want = append(want,
		mustPublish(t, h, "", map[string]string{"broadcast": "while refused"}),
		mustPublish(t, h, "room", map[string]int{"n": 3}),
	)
	mustPublish(t, h, "other", map[string]int{"n": 99}) // invisible to the page
	if got := len(browserState(t, tab).events()); got != 1 {
		t.Fatalf("the refused page received events: %s", browserDump(browserState(t, tab)))
	}

	// The slot frees: the page is served and resumes with nothing lost.
	occupier.Close()
	browserWaitEvents(t, tab, len(want))
	want = append(want, mustPublish(t, h, "room", map[string]int{"n": 4})) // live
	st := browserWaitEvents(t, tab, len(want))
	browserAssertEvents(t, st, want)
	if len(st.ofType("gap")) != 0 {
		t.Fatalf("unexpected gap: %s", browserDump(st))
	}
	refusedWithCursor := 0
	for _, r := range gate.requests() {
		if r.Method == http.MethodGet && r.LastEventID == strconv.FormatInt(want[0].Sequence, 10) {
			refusedWithCursor++
		}
	}
	// The resume, and before it every refused reconnect, carried the cursor.
	if refusedWithCursor < 3 {
		t.Fatalf("%d reconnects carried Last-Event-ID %d, want the refused ones and the resume: %+v",
			refusedWithCursor, want[0].Sequence, gate.requests())
	}
	if hellos := st.ofType("hello"); len(hellos) != 2 {
		t.Fatalf("want 2 hello frames (first connect, resume), got %s", browserDump(st))
	} else if cursor, _ := browserHello(t, hellos[1]); cursor != want[0].Sequence {
		t.Fatalf("resume hello cursor %d, want %d", cursor, want[0].Sequence)
	}
	t.Logf("refused %d times; %d opens, %d errors", h.metrics.refusedOverload.Load(), st.Opens, st.Errors)
}
