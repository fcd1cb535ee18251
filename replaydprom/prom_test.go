package replaydprom_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/sseparse"
	"github.com/replayd/replayd/replaydprom"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// waitFor bounds every wait.
const waitFor = 10 * time.Second

// replayBounds are the replayed-events histogram's buckets.
var replayBounds = []string{"0", "1", "5", "10", "25", "50", "100", "250", "500", "1000", "2500", "5000", "10000"}

// want is every value the collector should report.
type want struct {
	published, duplicates, head int64
	sse, poll                   int64
	refused                     map[string]int64 // by reason; absent: 0
	replayedSSE, replayedPoll   []int64          // the observations
	gaps                        map[string]int64 // by reason; absent: 0
	slow, live, pruned, polls   int64
	tailLag                     float64
}

// text is want in the exposition format, replayd_publish_duration_seconds
// left out (its buckets depend on timing; see checkPublishDuration).
func (w want) text() string {
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	family("replayd_connections", "gauge", "open sse streams and waiting long polls.")
	fmt.Fprintf(&b, "replayd_connections{transport=\"poll\"} %d\nreplayd_connections{transport=\"sse\"} %d\n", w.poll, w.sse)
	family("replayd_events_published_total", "counter", "events stored by this hub; duplicates are not counted.")
	fmt.Fprintf(&b, "replayd_events_published_total %d\n", w.published)
	family("replayd_gaps_total", "counter", "gap frames sent, by reason.")
	for _, r := range []string{"invalid_cursor", "pruned", "replay_limit", "unknown_cursor"} {
		fmt.Fprintf(&b, "replayd_gaps_total{reason=%q} %d\n", r, w.gaps[r])
	}
	family("replayd_head_sequence", "gauge", "the log's head: the highest sequence ever assigned, read at scrape time.")
	// A gauge is a float64: the head (near the clock in microseconds, the
	// sequence floor) prints in the exponent form, exactly (below 2^53).
	fmt.Fprintf(&b, "replayd_head_sequence %s\n", strconv.FormatFloat(float64(w.head), 'g', -1, 64))
	family("replayd_live_frames_total", "counter", "event frames queued to live connections.")
	fmt.Fprintf(&b, "replayd_live_frames_total %d\n", w.live)
	family("replayd_publish_duplicates_total", "counter", "publishes that stored nothing because their event id was known.")
	fmt.Fprintf(&b, "replayd_publish_duplicates_total %d\n", w.duplicates)
	family("replayd_pruned_events_total", "counter", "events deleted by retention.")
	fmt.Fprintf(&b, "replayd_pruned_events_total %d\n", w.pruned)
	family("replayd_replayed_events", "histogram", "events replayed per sse connection, and per poll answer.")
	for _, tr := range []struct {
		name string
		obs  []int64
	}{{"poll", w.replayedPoll}, {"sse", w.replayedSSE}} {
		var sum int64
		for _, v := range tr.obs {
			sum += v
		}
		for _, le := range replayBounds {
			var bound, n int64
			fmt.Sscan(le, &bound)
			for _, v := range tr.obs {
				if v <= bound {
					n++
				}
			}
			fmt.Fprintf(&b, "replayd_replayed_events_bucket{transport=%q,le=%q} %d\n", tr.name, le, n)
		}
		fmt.Fprintf(&b, "replayd_replayed_events_bucket{transport=%q,le=\"+Inf\"} %d\n", tr.name, len(tr.obs))
		fmt.Fprintf(&b, "replayd_replayed_events_sum{transport=%q} %d\n", tr.name, sum)
		fmt.Fprintf(&b, "replayd_replayed_events_count{transport=%q} %d\n", tr.name, len(tr.obs))
	}
	family("replayd_requests_refused_total", "counter", "sse and poll requests refused, by the answer they got.")
	for _, r := range []string{"bad_request", "forbidden", "origin", "overload", "unauthenticated"} {
		fmt.Fprintf(&b, "replayd_requests_refused_total{reason=%q} %d\n", r, w.refused[r])
	}
	family("replayd_slow_consumer_disconnects_total", "counter", "connections cut off for passing max buffered bytes.")
	fmt.Fprintf(&b, "replayd_slow_consumer_disconnects_total %d\n", w.slow)
	family("replayd_tail_lag_seconds", "gauge", "age of the newest row the tail delivered when it last found rows; 0 when caught up.")
	fmt.Fprintf(&b, "replayd_tail_lag_seconds %g\n", w.tailLag)
	family("replayd_tail_polls_total", "counter", "polls of the log by the tail.")
	fmt.Fprintf(&b, "replayd_tail_polls_total %d\n", w.polls)
	return b.String()
}

// exactNames are the metrics compared value for value.
var exactNames = []string{
	"replayd_events_published_total", "replayd_publish_duplicates_total", "replayd_head_sequence",
	"replayd_connections", "replayd_requests_refused_total", "replayd_replayed_events", "replayd_gaps_total",
	"replayd_slow_consumer_disconnects_total", "replayd_live_frames_total", "replayd_pruned_events_total",
	"replayd_tail_polls_total", "replayd_tail_lag_seconds",
}

func compare(t *testing.T, reg prometheus.Gatherer, w want) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(w.text()), exactNames...); err != nil {
		t.Fatal(err)
	}
}

// checkPublishDuration checks the publish histogram's shape: count
// observations, a positive sum, cumulative buckets from 50µs to 10s.
func checkPublishDuration(t *testing.T, reg prometheus.Gatherer, count uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "replayd_publish_duration_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != count || (count > 0) != (h.GetSampleSum() > 0) {
			t.Fatalf("publish duration: %d observations summing to %v, want %d", h.GetSampleCount(), h.GetSampleSum(), count)
		}
		bs := h.GetBucket()
		if len(bs) != 17 || bs[0].GetUpperBound() != 0.00005 || bs[16].GetUpperBound() != 10 {
			t.Fatalf("publish duration buckets: %v", bs)
		}
		for i, b := range bs {
			if b.GetCumulativeCount() > count || i > 0 && b.GetCumulativeCount() < bs[i-1].GetCumulativeCount() {
				t.Fatalf("publish duration buckets not cumulative: %v", bs)
			}
		}
		return
	}
	t.Fatal("no replayd_publish_duration_seconds")
}

// Known traffic through a real hub over real HTTP; every metric is then
// exactly what that traffic implies.
func TestMetricsOverHTTP(t *testing.T) {
	dir := t.TempDir()
	db, err := replayd.OpenDB(filepath.Join(dir, "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h, err := replayd.New(db, replayd.Options{
		SSE: replayd.SSEOptions{
			ReplayLimit:       2,
			MaxBufferedBytes:  4096,
			HeartbeatInterval: -1,
			MaxConnections:    4,
		},
		Authorize: func(r *http.Request, topics []string) error {
			switch r.Header.Get("X-Test-Auth") {
			case "deny":
				return errors.New("not this one")
			case "anonymous":
				return fmt.Errorf("no session: %w", replayd.ErrUnauthenticated)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	psrv := httptest.NewServer(h.PollHandler())
	defer psrv.Close()
	defer h.Close() // first: it ends the streams srv.Close waits for
	reg := prometheus.NewPedanticRegistry()
	if err := replaydprom.Register(reg, h); err != nil {
		t.Fatal(err)
	}
	if err := replaydprom.Register(reg, h); err == nil {
		t.Fatal("registering the same metrics twice succeeded")
	}

	// Every series exists from the start, at 0, but the head: the log's
	// once opened (the sequence floor).
	w := want{}
	if w.head, err = h.LatestSequence(context.Background()); err != nil {
		t.Fatal(err)
	}
	compare(t, reg, w)
	checkPublishDuration(t, reg, 0)

	ctx := context.Background()
	publish := func(topic string, payload any, opts ...replayd.PublishOption) replayd.Event {
		t.Helper()
		ev, err := h.Publish(ctx, topic, payload, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	// Five events on a, the first with a known id, then that id again.
	publish("a", 0, replayd.WithEventID("first"))
	for i := 1; i < 5; i++ {
		publish("a", i)
	}
	publish("a", "again", replayd.WithEventID("first"))
	w.published, w.duplicates = 5, 1

	// The long-lived connection, fresh: nothing replayed.
	long := dial(t, srv.URL+"?topic=b", "")
	long.expect(t, "hello")
	w.replayedSSE = append(w.replayedSSE, 0)

	// replay_limit: 5 missed, 2 replayed.
	c := dial(t, srv.URL+"?topic=a", "0")
	c.expect(t, "hello", "gap", "message", "message")
	c.close()
	w.gaps = map[string]int64{"replay_limit": 1}
	w.replayedSSE = append(w.replayedSSE, 2)
	// unknown_cursor and invalid_cursor: nothing replayed.
	c = dial(t, srv.URL+"?topic=a", "999")
	c.expect(t, "hello", "gap")
	c.close()
	c = dial(t, srv.URL+"?topic=a", "x")
	c.expect(t, "hello", "gap")
	c.close()
	w.gaps["unknown_cursor"], w.gaps["invalid_cursor"] = 1, 1
	w.replayedSSE = append(w.replayedSSE, 0, 0)
	// pruned: retention deletes two of a's five; the newest 2 are replayed.
	if n, err := h.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 3}); err != nil || n != 2 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	w.pruned = 2
	c = dial(t, srv.URL+"?topic=a", "0")
	c.expect(t, "hello", "gap", "message", "message")
	c.close()
	w.gaps["pruned"] = 1
	w.replayedSSE = append(w.replayedSSE, 2)

	// Only the long-lived connection is left open.
	waitConnections(t, h, 1)
	w.sse = 1
	// A duplicate may spend a sequence: here the head is read, at the
	// end it is known from the last publish.
	if w.head, err = h.LatestSequence(ctx); err != nil {
		t.Fatal(err)
	}
	compare(t, reg, w)
	w.sse = 0

	// Three live events reach it.
	for i := range 3 {
		publish("b", i)
	}
	long.expect(t, "message", "message", "message")
	w.published += 3
	w.live = 3

	// A slow consumer: a raw connection that sends its request and never
	// reads. Big events on its topic fill the socket buffers until its
	// queue passes MaxBufferedBytes; every frame queued before that counts
	// as a live frame, the one that did not fit does not.
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /?topic=slow HTTP/1.1\r\nHost: %s\r\n\r\n", srv.Listener.Addr())
	waitConnections(t, h, 2)
	w.replayedSSE = append(w.replayedSSE, 0)
	big := json.RawMessage(`"` + strings.Repeat("x", 64<<10) + `"`)
	var last replayd.Event
	for k := 1; h.Metrics().SlowConsumerDisconnects == 0; k++ {
		if k > 2000 { // 128 MiB: far more than socket buffers hold
			t.Fatal("the slow consumer was never cut off")
		}
		last = publish("slow", big)
		w.published++
		w.live++
	}
	w.live-- // the frame that did not fit
	w.slow = 1
	w.head = last.Sequence
	conn.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("slow connection not closed by the server: %v", err)
	}
	waitConnections(t, h, 1)

	// Refused: a foreign origin (403), an invalid topic (400), and
	// Authorize's 403 and 401.
	for _, c := range []struct {
		query, header, value string
		want                 int
	}{
		{"?topic=a", "Origin", "https://elsewhere.example", http.StatusForbidden},
		{"?topic=%01", "", "", http.StatusBadRequest},
		{"?topic=a", "X-Test-Auth", "deny", http.StatusForbidden},
		{"?topic=a", "X-Test-Auth", "anonymous", http.StatusUnauthorized},
	} {
		if code := status(t, srv.URL+c.query, c.header, c.value); code != c.want {
			t.Fatalf("%s with %s %q: %d, want %d", c.query, c.header, c.value, code, c.want)
		}
	}
	w.refused = map[string]int64{"origin": 1, "bad_request": 1, "forbidden": 1, "unauthenticated": 1}

	// Overload: with MaxConnections (4) streams open, the next request is
	// answered with only a retry and ends without a stream.
	var more []*stream
	for range 3 {
		c := dial(t, srv.URL+"?topic=b", "")
		c.expect(t, "hello")
		more = append(more, c)
		w.replayedSSE = append(w.replayedSSE, 0)
	}
	if code := status(t, srv.URL+"?topic=b", "", ""); code != http.StatusOK {
		t.Fatalf("overloaded stream: %d", code)
	}
	if code := status(t, psrv.URL+"?topic=b&cursor=0", "", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("overloaded poll: %d", code)
	}
	w.refused["overload"] = 2
	w.sse = 4
	// A stream's replay is observed after its hello is sent: the client
	// may read the hello first.
	waitUntil(t, "every replay observed", func() bool {
		return h.Metrics().ReplayedSSE.Count == uint64(len(w.replayedSSE))
	})
	compare(t, reg, w)
	w.sse = 0
	for _, c := range more {
		c.close()
	}
	waitConnections(t, h, 1)

	// A long poll waits (a connection), and is answered with the one event
	// published on its topic: one observation of 1 replayed event.
	answered := make(chan int, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("%s?topic=p&cursor=%d&wait=20", psrv.URL, w.head))
		if err != nil {
			answered <- 0
			return
		}
		var ans struct{ Events []json.RawMessage }
		json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		answered <- len(ans.Events)
	}()
	waitUntil(t, "a waiting poll", func() bool { return h.Metrics().PollConnections == 1 })
	w.sse, w.poll = 1, 1
	compare(t, reg, w)
	w.sse, w.poll = 0, 0
	w.head = publish("p", "for the poll").Sequence
	w.published++
	if n := <-answered; n != 1 {
		t.Fatalf("the long poll got %d events", n)
	}
	w.replayedPoll = []int64{1}
	waitUntil(t, "no waiting poll", func() bool { return h.Metrics().PollConnections == 0 })
	// The poll was near the head: read from memory, at least once (once
	// when it arrived, once when woken, unless a probe failed).
	if got, want := gathered(t, reg, "replayd_poll_memory_answers_total"), h.Metrics().PollsFromMemory; got != float64(want) || want == 0 {
		t.Fatalf("replayd_poll_memory_answers_total %v, the hub's count %d; want it, and above 0", got, want)
	}

	// One tail poll, caught up.
	stop, err := h.StartTail(time.Hour, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a tail poll", func() bool { return h.Metrics().TailPolls == 1 })
	stop()
	w.polls = 1

	long.close()
	waitConnections(t, h, 0)
	compare(t, reg, w)
	checkPublishDuration(t, reg, uint64(w.published+w.duplicates))
}

// gathered returns the value of reg's metric name, which has no labels.
func gathered(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

// A hub whose log cannot be read still exports its counters; only the head
// is missing from the scrape.
func TestHeadLeftOutWhenTheLogFails(t *testing.T) {
	db, err := replayd.OpenDB(filepath.Join(t.TempDir(), "events.db"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := replayd.New(db, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	reg := prometheus.NewPedanticRegistry()
	if err := replaydprom.Register(reg, h); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Publish(context.Background(), "a", 1); err != nil {
		t.Fatal(err)
	}
	db.Close()
	n, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Every series but the head: 9 without labels, 2 connections, 5
	// refusal reasons, 2 replayed histograms, 4 gap reasons.
	if want := 9 + 2 + 5 + 2 + 4; n != want {
		t.Fatalf("%d series, want %d", n, want)
	}
	if n, _ := testutil.GatherAndCount(reg, "replayd_head_sequence"); n != 0 {
		t.Fatal("head exported although the log cannot be read")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(
		"# HELP replayd_events_published_total events stored by this hub; duplicates are not counted.\n"+
			"# TYPE replayd_events_published_total counter\nreplayd_events_published_total 1\n"),
		"replayd_events_published_total"); err != nil {
		t.Fatal(err)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitConnections(t *testing.T, h *replayd.EventHub, n int64) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%d open connections", n), func() bool { return h.Metrics().SSEConnections == n })
}

// status sends a GET with one header set, if named, and returns the
// status.
func status(t *testing.T, url, header, value string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if header != "" {
		req.Header.Set(header, value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// stream is a minimal SSE client: it reads frames' event types.
type stream struct {
	resp   *http.Response
	cancel context.CancelFunc
	events chan string // each frame's event type
	done   chan error  // the stream's end
}

func dial(t *testing.T, url, lastEventID string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("GET %s: %v %v", url, resp, err)
	}
	s := &stream{resp: resp, cancel: cancel, events: make(chan string, 64), done: make(chan error, 1)}
	go func() {
		r := sseparse.NewReader(resp.Body)
		for {
			f, err := r.Next()
			if err != nil {
				s.done <- err // io.EOF at its end
				return
			}
			s.events <- string(f.Event)
		}
	}()
	t.Cleanup(s.close)
	return s
}

// expect reads frames of the given event types, in order.
func (s *stream) expect(t *testing.T, events ...string) {
	t.Helper()
	for i, want := range events {
		select {
		case got := <-s.events:
			if got != want {
				t.Fatalf("frame %d is %q, want %q", i, got, want)
			}
		case err := <-s.done:
			t.Fatalf("stream ended before frame %d: %v", i, err)
		case <-time.After(waitFor):
			t.Fatalf("no frame %d", i)
		}
	}
}

func (s *stream) close() {
	s.cancel()
	s.resp.Body.Close()
}
