package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// Each case: a client subscribes to topic t and gets events 1-3 live; then
// the server ends its stream one way, and events are published while the
// client is away (at least three, more than ReplayLimit 2, so an exact
// resume is a replay_limit gap followed by the newest two); then one more
// event once the client is back. The case records whether the client came
// back, the Last-Event-ID it sent, what it handed the application, and
// whether it gave up by itself.

// ending is one way a server ends a stream.
type ending struct {
	name string
	doc  string
}

var endings = []ending{
	{"revoked", "the stream's replayd.WithRevocation context is cancelled: the response ends cleanly, with its last chunk"},
	{"slow-consumer", "the client stops reading and the hub cuts it (SSEOptions.MaxBufferedBytes): the connection closes without the response's last chunk"},
	{"overload", "the TCP connection is reset; the reconnect gets the overload answer (200, retry: only, a clean end)"},
	{"close", "hub Close ends the stream (without the last chunk); the server is down 300 ms (connection refused); a new hub on the same file, a new listener on the same address"},
	{"closing-hub", "as close, but a reconnect reaches the closed hub first, which answers 200 and ends at once (a clean end)"},
	{"503", "the TCP connection is reset; the reconnect gets 503 with Retry-After: 1 (a proxy in front while the application restarts)"},
	{"network", "the TCP connection is reset mid-stream"},
}

type verdict string

const (
	resumes   verdict = "resumes exactly"
	fresh     verdict = "reconnects without a cursor"
	stops     verdict = "stops"
	lossy     verdict = "resumes with a loss or a duplicate"
	noConnect verdict = "did not reconnect in time"
)

// outcome is what a case measured.
type outcome struct {
	verdict  verdict
	gap      bool     // the gap frame reached the application
	lastID   string   // the cursor of the first reconnect served a stream (Last-Event-ID, or lastEventId in the query); "-" if none
	answers  []string // what each request after the ending was answered
	messages []string // ids of the message events handed over, in order
	empty    int      // frames handed over with neither a type nor data (a retry-only block)
	stopErr  error
}

// expect is the behaviour docs/clients.md states.
type expect struct {
	verdict verdict
	gap     bool
}

// expected is the measured table; a client release that changes a cell
// fails TestClients. Update docs/clients.md with it.
var expected = map[string]map[string]expect{
	"r3labs/sse": {
		"revoked":       {stops, false},
		"slow-consumer": {resumes, true},
		"overload":      {stops, false},
		"close":         {resumes, true},
		"closing-hub":   {stops, false},
		"503":           {resumes, true},
		"network":       {resumes, true},
	},
	"r3labs/sse+loop": {
		"revoked":       {resumes, true},
		"slow-consumer": {resumes, true},
		"overload":      {resumes, true},
		"close":         {resumes, true},
		"closing-hub":   {resumes, true},
		"503":           {resumes, true},
		"network":       {resumes, true},
	},
	"launchdarkly/eventsource": {
		"revoked":       {resumes, true},
		"slow-consumer": {resumes, true},
		"overload":      {resumes, true},
		"close":         {resumes, true},
		"closing-hub":   {resumes, true},
		"503":           {resumes, true},
		"network":       {resumes, true},
	},
	"tmaxmax/go-sse": {
		"revoked":       {resumes, true},
		"slow-consumer": {resumes, true},
		"overload":      {resumes, true},
		"close":         {resumes, true},
		"closing-hub":   {resumes, true},
		"503":           {stops, false},
		"network":       {resumes, true},
	},
	"tmaxmax/go-sse+loop": {
		"revoked":       {resumes, true},
		"slow-consumer": {resumes, true},
		"overload":      {resumes, true},
		"close":         {resumes, true},
		"closing-hub":   {resumes, true},
		"503":           {resumes, true},
		"network":       {resumes, true},
	},
	"npm eventsource": {
		"revoked":       {resumes, true},
		"slow-consumer": {resumes, true},
		"overload":      {resumes, true},
		"close":         {resumes, true},
		"closing-hub":   {resumes, true},
		"503":           {stops, false},
		"network":       {resumes, true},
	},
	"npm eventsource+reopen": {
		"revoked":       {resumes, true},
		"slow-consumer": {resumes, true},
		"overload":      {resumes, true},
		"close":         {resumes, true},
		"closing-hub":   {resumes, true},
		"503":           {resumes, true},
		"network":       {resumes, true},
	},
}

// emptyFrame lists the cases where the client hands the application a
// frame with neither a type nor data: the overload answer's retry-only
// block, or (r3labs/sse) the closed hub's comment-only answer, passed on
// as an event. Applications must ignore such events.
var emptyFrame = map[string]bool{
	"r3labs/sse × overload":               true,
	"r3labs/sse × closing-hub":            true,
	"r3labs/sse+loop × overload":          true,
	"r3labs/sse+loop × closing-hub":       true,
	"launchdarkly/eventsource × overload": true,
	"tmaxmax/go-sse × overload":           true,
	"tmaxmax/go-sse+loop × overload":      true,
}

const (
	caseTimeout  = 10 * time.Second // the whole case
	comeBackTime = 5 * time.Second  // how long a client has to reconnect
	outage       = 300 * time.Millisecond
)

func TestClients(t *testing.T) {
	var table strings.Builder
	fmt.Fprintf(&table, "\n| client | %s |\n|---|", strings.Join(names(endings), " | "))
	table.WriteString(strings.Repeat("---|", len(endings)) + "\n")
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			if strings.HasPrefix(c.name, "npm") {
				nodeDir(t) // skips (or fails under CI=true) without Node.js
			}
			fmt.Fprintf(&table, "| %s |", c.name)
			for _, e := range endings {
				var got outcome
				t.Run(e.name, func(t *testing.T) {
					got = runCase(t, c, e)
					t.Logf("%s: %s, gap %v, cursor %s, answers %v, messages %v, empty frames %d, stopped: %v",
						e.doc, got.verdict, got.gap, got.lastID, got.answers, got.messages, got.empty, got.stopErr)
					want, ok := expected[c.name][e.name]
					if !ok {
						t.Fatalf("no expectation for %s × %s", c.name, e.name)
					}
					if got.verdict != want.verdict || got.gap != want.gap {
						t.Errorf("%s × %s: %s, gap %v; docs/clients.md says %s, gap %v",
							c.name, e.name, got.verdict, got.gap, want.verdict, want.gap)
					}
					if wantEmpty := emptyFrame[c.name+" × "+e.name]; (got.empty > 0) != wantEmpty {
						t.Errorf("%s × %s: %d empty frames handed over; docs/clients.md says some: %v",
							c.name, e.name, got.empty, wantEmpty)
					}
				})
				fmt.Fprintf(&table, " %s%s |", got.verdict, map[bool]string{true: " (gap)"}[got.gap])
			}
			table.WriteString("\n")
		})
	}
	t.Log(table.String())
}

func names(es []ending) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.name)
	}
	return out
}

// runClient starts c on url and waits until it has the stream's hello; the
// client is stopped, and must let go, at the end of the test.
func runClient(t *testing.T, ctx context.Context, c client, url string) *recorder {
	t.Helper()
	rec := &recorder{}
	cctx, stopClient := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(cctx, t, url, rec)
	}()
	t.Cleanup(func() {
		stopClient()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("%s still running 5 s after its context ended", c.name)
		}
	})
	connected := rec.until(ctx, func() bool {
		return rec.stopped || slices.ContainsFunc(rec.frames, func(f frame) bool { return f.typ == "hello" })
	})
	if !connected || rec.stopped {
		t.Fatalf("%s did not connect: %v", c.name, rec.err)
	}
	return rec
}

func runCase(t *testing.T, c client, e ending) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	opts := replayd.Options{SSE: replayd.SSEOptions{
		ReplayLimit:       2,
		HeartbeatInterval: -1,
		Retry:             100 * time.Millisecond,
		OverloadRetry:     100 * time.Millisecond,
	}}
	switch e.name {
	case "overload":
		opts.SSE.MaxConnections = 1
	case "slow-consumer":
		opts.SSE.MaxBufferedBytes = 64 << 10
	}
	s := newSite(t, opts)
	var px *proxy
	url := s.srv.URL + "/?topic=t"
	if e.name != "close" && e.name != "closing-hub" { // a restart keeps the address: no proxy
		px = newProxy(t, s.srv.Listener.Addr().String())
		url = "http://" + px.addr() + "/?topic=t"
	}

	rec := runClient(t, ctx, c, url)
	s.publish(ctx, 3)
	if !rec.until(ctx, func() bool { return rec.stopped || rec.has(fmt.Sprint(s.published[2])) }) || rec.stopped {
		t.Fatalf("%s did not get events 1-3: %v", c.name, rec.err)
	}

	from := s.front.logLen()
	missed := func() { s.publish(ctx, 3) }
	answered := func(answer string) { // waits until a request after the ending got answer
		wait, stop := context.WithTimeout(ctx, comeBackTime)
		defer stop()
		s.front.until(wait, func() bool {
			return slices.ContainsFunc(s.front.log[from:], func(r *request) bool { return r.answer == answer })
		})
	}
	switch e.name {
	case "revoked":
		s.front.shut()
		s.front.revokeAll()
		s.front.idle(t, ctx)
		missed()
		s.front.open()
	case "slow-consumer":
		s.front.shut()
		px.pause()
		s.publishUntilCut(ctx)
		missed()
		px.resume()
		s.front.open()
	case "overload":
		s.front.shut()
		px.cut()
		s.front.idle(t, ctx)
		missed()
		release := s.block(ctx)
		s.front.open()
		answered("overload")
		release()
	case "close":
		s.stop(ctx)
		s.start(ctx, outage, missed)
	case "closing-hub":
		s.front.shut()
		s.closeHub()
		s.front.idle(t, ctx)
		s.front.open()
		answered("ended")
		s.stop(ctx)
		s.start(ctx, outage, missed)
	case "503":
		s.front.shut()
		s.front.refuseNext(1)
		px.cut()
		s.front.idle(t, ctx)
		missed()
		s.front.open()
	case "network":
		s.front.shut()
		px.cut()
		s.front.idle(t, ctx)
		missed()
		s.front.open()
	default:
		t.Fatalf("unknown ending %q", e.name)
	}

	// Did it come back? A stream served after the ending, or the client
	// gave up, or the time ran out.
	wait, stopWait := context.WithTimeout(ctx, comeBackTime)
	defer stopWait()
	var admitted *request
	untilEither(wait, &rec.board, &s.front.board, func() bool {
		s.front.mu.Lock()
		if i := slices.IndexFunc(s.front.log[from:], func(r *request) bool { return r.admitted }); i >= 0 {
			admitted = s.front.log[from+i]
		}
		s.front.mu.Unlock()
		_, stopped, _ := rec.snapshot()
		return admitted != nil || stopped
	})
	if admitted != nil {
		s.publish(ctx, 1)
		last := fmt.Sprint(s.published[len(s.published)-1])
		rec.until(wait, func() bool { return rec.stopped || rec.has(last) })
	}

	var got outcome
	frames, stopped, err := rec.snapshot()
	if stopped {
		got.stopErr = err
	}
	var exact bool
	got.messages, got.gap, exact = judge(t, s.published, frames)
	for _, f := range frames {
		if f.typ == "" && f.data == "" {
			got.empty++
		}
	}
	for _, r := range s.front.requests(from) {
		got.answers = append(got.answers, r.answer)
	}
	got.lastID = "-"
	switch {
	case admitted == nil && stopped:
		got.verdict = stops
	case admitted == nil:
		got.verdict = noConnect
	default:
		s.front.mu.Lock()
		if admitted.cursor != "" {
			got.lastID = admitted.cursor
		}
		s.front.mu.Unlock()
		switch {
		case got.lastID == "-":
			got.verdict = fresh
		case exact:
			got.verdict = resumes
		default:
			got.verdict = lossy
		}
	}
	return got
}

// judge checks what the client handed over against what was published:
// message ids ascending without a repeat, and each published event either
// handed over or inside the range of a gap that was. It returns the
// message ids, whether a gap was handed over, and whether all that held.
func judge(t *testing.T, published []int64, frames []frame) (ids []string, gap, exact bool) {
	t.Helper()
	got := map[int64]bool{}
	var covered [][2]int64
	exact = true
	var prev int64
	for _, f := range frames {
		switch f.typ {
		case "message":
			ids = append(ids, f.id)
			id, err := strconv.ParseInt(f.id, 10, 64)
			if err != nil || id <= prev {
				exact = false
			}
			prev = max(prev, id)
			got[id] = true
		case "gap":
			gap = true
			var g struct{ MissedFrom, MissedThrough *int64 }
			if err := json.Unmarshal([]byte(f.data), &g); err != nil || g.MissedFrom == nil || g.MissedThrough == nil {
				t.Logf("a gap without a range: %q", f.data)
				continue
			}
			covered = append(covered, [2]int64{*g.MissedFrom, *g.MissedThrough})
		}
	}
	for _, seq := range published {
		if !got[seq] && !slices.ContainsFunc(covered, func(r [2]int64) bool { return r[0] <= seq && seq <= r[1] }) {
			exact = false
		}
	}
	return ids, gap, exact
}
