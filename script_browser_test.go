package replayd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/headless"
	"github.com/replayd/replayd/internal/sqlitetest"
)

// Browser tests of the module served by ClientScript, in headless
// Chromium (the harness of browser_test.go). The page imports the module,
// subscribes with the options in its query, and records what onEvent and
// onGap receive; with keep, the record lives in sessionStorage too, so it
// spans reloads of the page.

// clientPageHTML subscribes with the JSON options of the opts parameter.
const clientPageHTML = `<!doctype html>
<meta charset="utf-8">
<title>replayd module test</title>
<script type="module">
import { subscribe } from "/replayd.js";
const q = new URLSearchParams(location.search);
const keep = q.get("keep");
const opts = JSON.parse(q.get("opts"));
if (opts.noEventSource) delete window.EventSource; // the module ignores the extra option
if (opts.paramsFrom) opts.params = async () =>
  ({access_token: await (await fetch(opts.paramsFrom, {cache: "no-store"})).text()});
window.rec = keep ? JSON.parse(sessionStorage.getItem(keep) || "[]") : [];
const push = r => {
  window.rec.push(r);
  if (keep) sessionStorage.setItem(keep, JSON.stringify(window.rec));
};
window.sub = subscribe({
  ...opts,
  onEvent(ev) {
    push({kind: "event", id: ev.id, type: ev.type, hasTopic: "topic" in ev,
          topic: ev.topic ?? null, data: JSON.stringify(ev.data)});
  },
  onGap(gap) { push({kind: "gap", data: JSON.stringify(gap)}); },
});
window.ready = true;
</script>
`

// clientRecord is one call of onEvent or onGap as the page saw it.
type clientRecord struct {
	Kind     string  `json:"kind"` // "event" or "gap"
	ID       int64   `json:"id"`
	Type     string  `json:"type"`
	HasTopic bool    `json:"hasTopic"`
	Topic    *string `json:"topic"`
	Data     string  `json:"data"` // JSON.stringify of the parsed data
}

// clientPageState is the page's record, its subscription's cursor and the
// cursor stored under the storage key stored (if the page was given one).
type clientPageState struct {
	Ready  bool           `json:"ready"`
	Rec    []clientRecord `json:"rec"`
	Cursor *int64         `json:"cursor"`
	Stored *string        `json:"stored"`
}

func (s clientPageState) events() []clientRecord {
	var out []clientRecord
	for _, r := range s.Rec {
		if r.Kind == "event" {
			out = append(out, r)
		}
	}
	return out
}

// clientMux serves the module at /replayd.js, the page at /module, sse at
// /events and poll (if not nil) at /poll.
func clientMux(sse, poll http.Handler) *http.ServeMux {
	mux := browserMux(sse)
	if poll != nil {
		mux.Handle("/poll", poll)
	}
	mux.Handle("/replayd.js", ClientScript())
	mux.HandleFunc("/module", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprint(w, clientPageHTML)
	})
	return mux
}

// clientNavigate loads the page at base+"/module", subscribing with opts and
// keeping its record in sessionStorage under keep (none if empty).
func clientNavigate(t *testing.T, tab context.Context, base string, opts map[string]any, keep string) {
	t.Helper()
	o, err := json.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	q := url.Values{"opts": {string(o)}}
	if keep != "" {
		q.Set("keep", keep)
	}
	ctx, cancel := context.WithTimeout(tab, browserWait)
	defer cancel()
	if err := headless.Navigate(ctx, base+"/module?"+q.Encode()); err != nil {
		t.Fatalf("navigate: %v", err)
	}
}

// clientReload reloads the page.
func clientReload(t *testing.T, tab context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserWait)
	defer cancel()
	if err := headless.Reload(ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
}

// clientState reads the page's state; storageKey names the stored cursor.
func clientState(tab context.Context, storageKey string) (clientPageState, error) {
	ctx, cancel := context.WithTimeout(tab, 5*time.Second)
	defer cancel()
	return headless.Evaluate[clientPageState](ctx, fmt.Sprintf(
		`({ready: !!window.ready, rec: window.rec || [], cursor: window.sub ? window.sub.cursor : null,
		   stored: %q ? sessionStorage.getItem(%[1]q) : null})`, storageKey))
}

// clientWaitUntil reads the page's state until cond holds, for at most
// browserWait. A read that fails (the page is reloading) is retried.
func clientWaitUntil(t *testing.T, tab context.Context, storageKey, what string, cond func(clientPageState) bool) clientPageState {
	t.Helper()
	deadline := time.Now().Add(browserWait)
	for {
		st, err := clientState(tab, storageKey)
		if err == nil && st.Ready && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(st, "", "  ")
			t.Fatalf("timed out after %v waiting for %s (last read error: %v); page state: %s", browserWait, what, err, b)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// clientWaitEvents waits until the page has recorded n events.
func clientWaitEvents(t *testing.T, tab context.Context, storageKey string, n int) clientPageState {
	t.Helper()
	return clientWaitUntil(t, tab, storageKey, fmt.Sprintf("%d events", n), func(st clientPageState) bool {
		return len(st.events()) >= n
	})
}

// clientWaitCursor waits until the page's subscription has a cursor.
func clientWaitCursor(t *testing.T, tab context.Context, storageKey string) clientPageState {
	t.Helper()
	return clientWaitUntil(t, tab, storageKey, "a cursor", func(st clientPageState) bool { return st.Cursor != nil })
}

// clientAssertEvents checks that the page's onEvent saw exactly want, in
// order. shape is the transport's: "sse" (no topic), "poll" (the topic,
// null for a broadcast) or "any" (topics not compared: both transports).
func clientAssertEvents(t *testing.T, st clientPageState, want []Event, shape string) {
	t.Helper()
	got := st.events()
	exp := make([]clientRecord, len(want))
	for i, w := range want {
		exp[i] = clientRecord{Kind: "event", ID: w.Sequence, Type: w.Type, Data: string(w.Payload)}
		if shape == "poll" {
			exp[i].HasTopic = true
			if w.Topic != "" {
				exp[i].Topic = &want[i].Topic
			}
		}
	}
	if shape == "any" {
		for i := range got {
			got[i].HasTopic, got[i].Topic = false, nil
		}
	}
	if g, e := mustJSON(got), mustJSON(exp); string(g) != string(e) {
		t.Fatalf("onEvent calls differ from what was published\n got %s\nwant %s", g, e)
	}
}

// TestBrowserModule runs the module's scenarios in one Chromium, each in
// its own tab and browser context.
func TestBrowserModule(t *testing.T) {
	browser := browserStart(t)
	t.Run("SSEOnceInOrder", func(t *testing.T) { clientTestSSEOnceInOrder(t, browser) })
	t.Run("SSEReloadResumes", func(t *testing.T) { clientTestReloadResumes(t, browser, "sse") })
	t.Run("SSEReloadWithoutStorageKey", func(t *testing.T) { clientTestSSEReloadFresh(t, browser) })
	t.Run("SSEGap", func(t *testing.T) { clientTestSSEGap(t, browser) })
	t.Run("SSEUnknownCursor", func(t *testing.T) { clientTestUnknownCursor(t, browser, "sse") })
	t.Run("PollOnceInOrder", func(t *testing.T) { clientTestPollOnceInOrder(t, browser) })
	t.Run("PollReloadResumes", func(t *testing.T) { clientTestReloadResumes(t, browser, "poll") })
	t.Run("PollUnknownCursor", func(t *testing.T) { clientTestUnknownCursor(t, browser, "poll") })
	t.Run("PollReadError", func(t *testing.T) { clientTestPollReadError(t, browser) })
	t.Run("SSERestoredInPlace", func(t *testing.T) { clientTestRestoredInPlace(t, browser, "sse") })
	t.Run("PollRestoredInPlace", func(t *testing.T) { clientTestRestoredInPlace(t, browser, "poll") })
	t.Run("AutoFallback", func(t *testing.T) { clientTestAutoFallback(t, browser) })
	t.Run("Close", func(t *testing.T) { clientTestClose(t, browser) })
	t.Run("SSEFreshToken", func(t *testing.T) { clientTestFreshParams(t, browser, "sse") })
	t.Run("PollFreshToken", func(t *testing.T) { clientTestFreshParams(t, browser, "poll") })
}

// params asked for again before each connection: a token revoked
// mid-stream (the stream ends, the EventSource's own reconnect with the
// old token is refused 401) is replaced by a fresh one from the page's
// params function, and the page resumes with nothing lost or repeated.
func clientTestFreshParams(t *testing.T, browser context.Context, transport string) {
	var (
		mu     sync.Mutex // guards tokens, issued
		tokens = map[string]context.CancelFunc{}
		issued []string
	)
	valid := func(tok string) (context.Context, bool) {
		mu.Lock()
		defer mu.Unlock()
		cancel, ok := tokens[tok]
		if !ok {
			return nil, false
		}
		ctx, c := context.WithCancel(context.Background())
		tokens[tok] = func() { cancel(); c() }
		return ctx, true
	}
	opts := browserOptions()
	opts.Authorize = func(r *http.Request, _ []string) error {
		if _, ok := valid(r.URL.Query().Get("access_token")); !ok {
			return ErrUnauthenticated
		}
		return nil
	}
	db, _ := openTestDB(t)
	h := newTestHub(t, db, opts)
	revocable := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if ctx, ok := valid(r.URL.Query().Get("access_token")); ok {
				r = r.WithContext(WithRevocation(r.Context(), ctx))
			}
			next.ServeHTTP(w, r)
		})
	}
	mux := clientMux(revocable(h.Handler()), revocable(h.PollHandler()))
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		tok := fmt.Sprintf("t%d", len(issued))
		issued = append(issued, tok)
		tokens[tok] = func() {}
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprint(w, tok)
	})
	srv := browserListen(t, "127.0.0.1:0", mux)
	revoke := func() {
		mu.Lock()
		defer mu.Unlock()
		for tok, cancel := range tokens {
			cancel()
			delete(tokens, tok)
		}
	}
	var want []Event
	want = append(want, mustPublish(t, h, "room", 1))
	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{
		"sse": "/events", "poll": "/poll", "transport": transport, "topics": []string{"room"},
		"cursor": 0, "storageKey": "k", "paramsFrom": "/token",
	}, "")
	clientWaitEvents(t, tab, "k", len(want))
	for round := range 2 {
		revoke()
		if transport == "sse" {
			// Revocation ends the stream asynchronously: an event
			// published at once could still go out on it.
			browserWaitNoClients(t, h)
		}
		for i := range 3 {
			want = append(want, mustPublish(t, h, "room", map[string]int{"round": round, "i": i}))
		}
		clientWaitEvents(t, tab, "k", len(want))
	}
	want = append(want, mustPublish(t, h, "room", "fence"))
	st := clientWaitEvents(t, tab, "k", len(want))
	clientAssertEvents(t, st, want, transport)
	mu.Lock()
	n := len(issued)
	mu.Unlock()
	if n < 3 {
		t.Fatalf("the page asked for %d tokens, want one per connection (at least 3)", n)
	}
}

// Over SSE, from cursor 0: the replay, live events, and a reconnect after
// the server drops the stream reach onEvent once each, in order; other
// topics and types not asked for are skipped; hello is not passed on; the
// cursor is the last id and is stored.
func clientTestSSEOnceInOrder(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{Retry: browserRetry, HeartbeatInterval: 50 * time.Millisecond}})
	var want []Event
	want = append(want, mustPublish(t, h, "room", map[string]int{"n": 1}))
	mustPublish(t, h, "other", map[string]int{"n": 99})
	want = append(want, mustPublish(t, h, "", map[string]string{"broadcast": "old"}))
	mustPublish(t, h, "room", map[string]int{"n": -1}, WithType("skipped"))
	gate := newBrowserGate(h.Handler())
	srv := browserListen(t, "127.0.0.1:0", clientMux(gate, nil))

	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{
		"sse": "/events", "transport": "sse", "topics": []string{"room"}, "cursor": 0,
		"storageKey": "k", "types": []string{"message", "chat"},
	}, "")
	clientWaitEvents(t, tab, "k", len(want))
	for i := range 5 {
		want = append(want, mustPublish(t, h, "room", map[string]int{"live": i}, WithType([]string{"message", "chat"}[i%2])))
	}
	clientWaitEvents(t, tab, "k", len(want))

	// The server drops the stream; what is published meanwhile is replayed.
	gate.hold()
	gate.dropAll()
	browserWaitNoClients(t, h)
	want = append(want, mustPublish(t, h, "room", map[string]int{"away": 1}))
	mustPublish(t, h, "room", map[string]int{"away": -1}, WithType("skipped"))
	want = append(want, mustPublish(t, h, "", map[string]int{"away": 2}))
	gate.release()
	clientWaitEvents(t, tab, "k", len(want))
	want = append(want, mustPublish(t, h, "room", map[string]int{"n": 2}))
	mustPublish(t, h, "room", map[string]int{"n": -2}, WithType("skipped"))
	// Heartbeats (every 50 ms) have no signal of their own: give a few of
	// them time to arrive; the fence then arrives after all of them.
	time.Sleep(200 * time.Millisecond)
	want = append(want, mustPublish(t, h, "room", "fence"))
	st := clientWaitEvents(t, tab, "k", len(want))

	clientAssertEvents(t, st, want, "sse")
	if len(st.Rec) != len(want) {
		t.Fatalf("the page recorded more than the events (a gap?): %+v", st.Rec)
	}
	lastSeen := want[len(want)-1].Sequence
	if st.Cursor == nil || *st.Cursor != lastSeen || st.Stored == nil || *st.Stored != strconv.FormatInt(lastSeen, 10) {
		t.Fatalf("cursor %v, stored %v; want %d", st.Cursor, st.Stored, lastSeen)
	}
	if !browserSawLastEventID(gate.requests(), want[6].Sequence) {
		t.Fatalf("no reconnect carried Last-Event-ID %d: %+v", want[6].Sequence, gate.requests())
	}
}

// A reload in the middle of a stream, with storageKey: while a publisher
// writes, the page is reloaded twice; the page's record (kept in
// sessionStorage beside the module's cursor) holds every event published
// after it joined exactly once, in order. transport is "sse" or "poll".
func clientTestReloadResumes(t *testing.T, browser context.Context, transport string) {
	db, _ := openTestDB(t)
	opts := browserOptions()
	opts.SSE.ReplayLimit = 1000
	h := newTestHub(t, db, opts)
	mustPublish(t, h, "room", "before the page") // not delivered: the page starts fresh
	srv := browserListen(t, "127.0.0.1:0", clientMux(h.Handler(), clientPollHandler(h)))

	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{
		"sse": "/events", "poll": "/poll", "transport": transport, "topics": []string{"room"}, "storageKey": "cur",
	}, "rec")
	st := clientWaitCursor(t, tab, "cur")
	head, _ := h.LatestSequence(context.Background())
	if *st.Cursor != head || st.Stored == nil || *st.Stored != strconv.FormatInt(head, 10) {
		t.Fatalf("after the hello: cursor %v, stored %v; want the head %d", st.Cursor, st.Stored, head)
	}

	const n = 150
	var (
		mu   sync.Mutex
		want []Event
	)
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := range n {
			topic := "room"
			if i%10 == 3 {
				topic = "other"
			}
			ev, err := h.Publish(context.Background(), topic, map[string]int{"i": i})
			if err != nil {
				t.Errorf("publish: %v", err)
				return
			}
			if topic == "room" {
				mu.Lock()
				want = append(want, ev)
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	clientWaitEvents(t, tab, "cur", 20)
	clientReload(t, tab)
	clientWaitEvents(t, tab, "cur", 60)
	clientReload(t, tab)
	<-published
	mu.Lock()
	defer mu.Unlock()
	st = clientWaitEvents(t, tab, "cur", len(want))
	clientAssertEvents(t, st, want, transport)
	if last := want[len(want)-1].Sequence; *st.Cursor != last || *st.Stored != strconv.FormatInt(last, 10) {
		t.Fatalf("cursor %v, stored %v; want %d", *st.Cursor, *st.Stored, last)
	}
}

// Without storageKey a reload starts fresh: what was published while the
// page was away is not delivered, and the new subscription starts at the
// head its hello reports.
func clientTestSSEReloadFresh(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, browserOptions())
	gate := newBrowserGate(h.Handler())
	srv := browserListen(t, "127.0.0.1:0", clientMux(gate, nil))

	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{"sse": "/events", "topics": []string{"room"}}, "rec")
	clientWaitCursor(t, tab, "")
	want := []Event{mustPublish(t, h, "room", "one"), mustPublish(t, h, "room", "two")}
	clientWaitEvents(t, tab, "", len(want))

	gate.hold()
	clientReload(t, tab)
	browserWaitNoClients(t, h)
	missed := mustPublish(t, h, "room", "while reloading")
	gate.release()
	st := clientWaitCursor(t, tab, "")
	if *st.Cursor != missed.Sequence {
		t.Fatalf("cursor after the reload %d, want the head %d", *st.Cursor, missed.Sequence)
	}
	want = append(want, mustPublish(t, h, "room", "after"))
	st = clientWaitEvents(t, tab, "", len(want))
	clientAssertEvents(t, st, want, "sse")
	if st.Stored != nil {
		t.Fatalf("a cursor was stored without storageKey: %q", *st.Stored)
	}
}

// A gap over SSE reaches onGap before the events after it, and the ids
// stay strictly increasing.
func clientTestSSEGap(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	opts := browserOptions()
	opts.SSE.ReplayLimit = 2
	opts.SSE.GapEventType = "replayd-gap"
	h := newTestHub(t, db, opts)
	gate := newBrowserGate(h.Handler())
	srv := browserListen(t, "127.0.0.1:0", clientMux(gate, nil))

	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{
		"sse": "/events", "topics": []string{"room"}, "gapType": "replayd-gap", "storageKey": "k",
	}, "")
	clientWaitCursor(t, tab, "k")
	seen := mustPublish(t, h, "room", "seen")
	clientWaitEvents(t, tab, "k", 1)

	gate.hold()
	gate.dropAll()
	browserWaitNoClients(t, h)
	var missed []Event
	for i := range 5 {
		missed = append(missed, mustPublish(t, h, "room", i))
	}
	gate.release()
	st := clientWaitEvents(t, tab, "k", 3)
	clientAssertEvents(t, st, []Event{seen, missed[3], missed[4]}, "sse")
	if len(st.Rec) != 4 || st.Rec[1].Kind != "gap" {
		t.Fatalf("want event, gap, event, event: %+v", st.Rec)
	}
	var g gapJSON
	if err := json.Unmarshal([]byte(st.Rec[1].Data), &g); err != nil {
		t.Fatal(err)
	}
	wantGap := gapJSON{Reason: reasonReplayLimit, ResumedFrom: i64p(seen.Sequence),
		MissedFrom: i64p(missed[0].Sequence), MissedThrough: i64p(missed[2].Sequence), Missed: i64p(3), ReplayLimit: 2}
	if gb, wb := mustJSON(g), mustJSON(wantGap); string(gb) != string(wb) {
		t.Fatalf("gap %s, want %s", gb, wb)
	}
}

// The poll endpoint cannot read the log for a while: it answers 503 with
// Retry-After and {"error":…} (issue 17, row 6), and the module waits and
// polls again from the same cursor: every event reaches onEvent once, in
// order, no gap, and no request after the fault carries an older cursor (a
// client taking the error for an answer would have gone back to 0).
func clientTestPollReadError(t *testing.T, browser context.Context) {
	db, _ := openTestDB(t)
	s, err := NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.(io.Closer).Close() })
	fs := &faultyStore{Store: s} // fails reads of the global scope, the page's
	opts := browserOptions()
	opts.SSE.OverloadRetry = 100 * time.Millisecond // Retry-After: 1
	h, err := NewWithStore(fs, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	var want []Event
	for i := range 3 {
		want = append(want, mustPublish(t, h, "room", map[string]int{"n": i}))
	}
	gate := &clientPollGate{next: clientPollHandler(h)}
	srv := browserListen(t, "127.0.0.1:0", clientMux(nil, gate))
	tab := browserTab(t, browser)
	clientNavigate(t, tab, srv.url(), map[string]any{"poll": "/poll", "cursor": 0, "storageKey": "k"}, "")
	clientWaitEvents(t, tab, "k", len(want))
	gate.waitServing(t, 1) // a long poll waits

	fs.failReads.Store(true)
	want = append(want, mustPublish(t, h, "room", "during the fault")) // wakes the waiting poll: its read fails
	failed := func() int {
		n := 0
		for _, r := range gate.answered() {
			if r.Status == http.StatusServiceUnavailable {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(browserWait)
	for failed() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the endpoint answered %d polls 503: %+v", failed(), gate.answered())
		}
		time.Sleep(10 * time.Millisecond)
	}
	fs.failReads.Store(false)
	want = append(want, mustPublish(t, h, "", "after the fault"))
	st := clientWaitEvents(t, tab, "k", len(want))
	clientAssertEvents(t, st, want, "poll")
	if len(st.Rec) != len(want) {
		t.Fatalf("the page recorded more than the events: %+v", st.Rec)
	}
	last := int64(-1)
	for _, r := range gate.requests() {
		c, err := strconv.ParseInt(r.Cursor, 10, 64)
		if err != nil || c < last {
			t.Fatalf("a poll went back to cursor %q after %d: %+v", r.Cursor, last, gate.requests())
		}
		last = c
	}
}

// A page that read a log's lost history and comes back after the log was
// restored in place under its hub (issue 28), with its cursor in
// sessionStorage: by then the restored log has more events than the page
// read since the backup, so their sequences would pass its cursor. It gets
// an unknown_cursor gap naming its cursor, then the next event; never the
// restored log's events as if they followed the lost ones.
func clientTestRestoredInPlace(t *testing.T, browser context.Context, transport string) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, browserOptions())
	backup := filepath.Join(t.TempDir(), "backup.db")
	want := []Event{mustPublish(t, h, "room", "kept")}
	sqlitetest.VacuumInto(t, path, backup)
	for i := range 5 {
		want = append(want, mustPublish(t, h, "room", map[string]int{"lost": i}))
	}
	srv := browserListen(t, "127.0.0.1:0", clientMux(h.Handler(), clientPollHandler(h)))
	tab := browserTab(t, browser)
	opts := map[string]any{"sse": "/events", "poll": "/poll", "transport": transport, "topics": []string{"room"},
		"cursor": 0, "storageKey": "cur"}
	clientNavigate(t, tab, srv.url(), opts, "rec")
	clientAssertEvents(t, clientWaitEvents(t, tab, "rec", len(want)), want, transport)
	last := want[len(want)-1].Sequence

	// The page goes away; the log is restored and takes 6 events.
	ctx, cancel := context.WithTimeout(tab, browserWait)
	defer cancel()
	if _, err := headless.Evaluate[any](ctx, `window.sub.close()`); err != nil {
		t.Fatalf("close the subscription: %v", err)
	}
	if err := headless.Navigate(ctx, "about:blank"); err != nil {
		t.Fatalf("navigate away: %v", err)
	}
	if transport == "sse" {
		browserWaitNoClients(t, h)
	}
	sqlitetest.RestoreInPlace(t, path, backup)
	for i := range 6 {
		mustPublish(t, h, "room", map[string]int{"restored": i})
	}
	clientNavigate(t, tab, srv.url(), opts, "rec") // resumes from the stored cursor
	st := clientWaitUntil(t, tab, "rec", "the gap", func(st clientPageState) bool { return len(st.Rec) > len(want) })
	var g gapJSON
	if r := st.Rec[len(want)]; r.Kind != "gap" || json.Unmarshal([]byte(r.Data), &g) != nil ||
		g.Reason != reasonUnknownCursor || g.ResumedFrom == nil || *g.ResumedFrom != last {
		t.Fatalf("back after the restore in place: %+v, want an unknown_cursor gap resumed from %d", r, last)
	}
	next := mustPublish(t, h, "room", "next")
	st = clientWaitEvents(t, tab, "rec", len(want)+1)
	st.Rec = slices.Delete(st.Rec, len(want), len(want)+1)
	clientAssertEvents(t, st, append(want, next), transport)
}
