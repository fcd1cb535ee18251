package replayd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// Request admission (origins, topics, Authorize, the connection cap) over real HTTP: strict topic parsing,
// the connection cap and its overload answer, and Options.Authorize.

func TestParseTopics(t *testing.T) {
	cases := []struct {
		query string
		max   int
		want  []string // nil: global
		err   bool
	}{
		{"", 32, nil, false},
		{"topic=", 32, nil, false},
		{"topic=%20%20&topic=", 32, nil, false},
		{"topic=&topic=a", 32, []string{"a"}, false},
		{"topic=a&topic=a", 32, []string{"a"}, false},
		{"topic=%20a&topic=a%20&topic=b&topic=a", 32, []string{"a", "b"}, false},
		{"topic=b&topic=a&topic=c&topic=b", 32, []string{"b", "a", "c"}, false},
		{"topic=a&topic=b&topic=a&topic=b", 2, []string{"a", "b"}, false},
		{"topic=a&topic=b&topic=c", 2, nil, true},
		{"topic=a&topic=%00", 32, nil, true},
		{"topic=" + strings.Repeat("x", 257), 32, nil, true},
		{"other=x&topic=a", 32, []string{"a"}, false},
	}
	for _, tc := range cases {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseTopics(q, "topic", tc.max)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("%q (max %d): %q, %v; want %q, error %v", tc.query, tc.max, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: error %v does not wrap ErrInvalid", tc.query, err)
		}
	}
}

// A request naming a huge number of topics is refused after MaxTopics+1 of
// them, not after comparing every value with every other one (quadratic:
// 200,000 values took minutes).
func TestParseTopicsManyValues(t *testing.T) {
	vals := make([]string, 200_000)
	for i := range vals {
		vals[i] = "t" + strconv.Itoa(i)
	}
	start := time.Now()
	if _, err := parseTopics(url.Values{"topic": vals}, "topic", 32); err == nil {
		t.Fatal("200,000 topics accepted")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("refusing 200,000 topics took %v", d)
	}
}

// dialAdmitted opens a stream and reports whether it was served (its first
// frame is the hello) or refused by the overload answer, whose retry it
// returns. The overload answer must hold only the retry and end.
func dialAdmitted(t testing.TB, u string) (c *wiretest.Client, served bool, retryMs int64) {
	t.Helper()
	c = wiretest.Dial(t, u, nil)
	f := c.NextNonHeartbeat()
	if f.Event == "hello" {
		return c, true, 0
	}
	if f.Retry == "" || f.Event != "" || f.Data != "" || f.HasID {
		t.Fatalf("first frame %+v: neither a hello nor the overload answer", f)
	}
	ms, err := strconv.ParseInt(f.Retry, 10, 64)
	if err != nil {
		t.Fatalf("retry %q: %v", f.Retry, err)
	}
	if g, err := c.NextErr(waitFor); !errors.Is(err, io.EOF) {
		t.Fatalf("the overload answer went on with %+v, %v", g, err)
	}
	c.Close()
	return nil, false, ms
}

// The cap is exact under concurrent connects: never more than
// MaxConnections streams served at once, every other request refused with
// only a jittered retry, nothing read or subscribed for a refusal, and a
// freed slot lets the next client in.
func TestSSEConnectionCap(t *testing.T) {
	const limit, clients = 3, 40
	const retry = 100 * time.Millisecond
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{MaxConnections: limit, OverloadRetry: retry}})
	var subscribed, over atomic.Int64
	h.testHookAfterSubscribe = func() {
		subscribed.Add(1)
		if n := h.Clients().Total(); n > limit {
			over.Store(int64(n))
		}
	}
	srv := serve(t, h)

	// Concurrent connects: exactly limit are served.
	type result struct {
		c      *wiretest.Client
		served bool
		retry  int64
	}
	results := make(chan result, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, served, ms := dialAdmitted(t, srv.URL+"?topic=a")
			results <- result{c, served, ms}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	var served []*wiretest.Client
	retries := map[int64]bool{}
	for r := range results {
		if r.served {
			served = append(served, r.c)
			continue
		}
		if r.retry < retry.Milliseconds() || r.retry > 2*retry.Milliseconds() {
			t.Errorf("retry %d ms outside [%d, %d]", r.retry, retry.Milliseconds(), 2*retry.Milliseconds())
		}
		retries[r.retry] = true
	}
	if len(served) != limit {
		t.Fatalf("%d of %d concurrent clients served, want exactly %d", len(served), clients, limit)
	}
	if len(retries) < 2 {
		t.Errorf("%d refusals all got the same retry %v: no jitter", clients-limit, retries)
	}
	if got := subscribed.Load(); got != limit {
		t.Fatalf("%d streams subscribed, want %d: a refusal must not subscribe or read", got, limit)
	}
	if got := h.metrics.refusedOverload.Load(); got != clients-limit {
		t.Errorf("refused(overload) counted %d, want %d", got, clients-limit)
	}

	// The served streams work; a freed slot lets the next client in.
	ev := mustPublish(t, h, "a", "live")
	for _, c := range served {
		c.NextIs(ev.Sequence, "served client got")
	}
	if _, ok, _ := dialAdmitted(t, srv.URL); ok {
		t.Fatal("served past the cap")
	}
	served[0].Close()
	wiretest.WaitUntil(t, "the closed stream to free its slot", func() bool { return h.conns.Load() == limit-1 })
	c, ok, _ := dialAdmitted(t, srv.URL)
	if !ok {
		t.Fatal("a freed slot did not let the next client in")
	}
	c.Close()

	// Churn: connects and disconnects from many goroutines; the cap holds
	// at every admission.
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				c, ok, _ := dialAdmitted(t, srv.URL+"?topic=t"+strconv.Itoa((g+i)%4))
				if ok {
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	if n := over.Load(); n != 0 {
		t.Fatalf("%d streams served at once, cap %d", n, limit)
	}
	for _, c := range served[1:] {
		c.Close()
	}
	wiretest.WaitUntil(t, "every slot to be freed", func() bool { return h.conns.Load() == 0 })
}

// The poll transport's overload answer: 503 with Retry-After in whole
// seconds, at least OverloadRetry.
func TestOverloadAnswerPoll(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{OverloadRetry: 1500 * time.Millisecond}})
	for range 20 {
		w := httptest.NewRecorder()
		h.overloaded(w, httptest.NewRequest(http.MethodGet, "/poll", nil), transportPoll)
		n, err := strconv.Atoi(w.Header().Get("Retry-After"))
		if w.Code != http.StatusServiceUnavailable || err != nil || n < 2 || n > 3 {
			t.Fatalf("poll overload answer %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
		}
	}
}

// lockedBuffer is an io.Writer safe for concurrent use, for a test logger.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Authorize sees the scope's topics in order (empty for global), once per
// request and after the cheaper checks; a refusal is 401 or 403 with a
// fixed body, the error's text only in the debug log, and no stream.
func TestSSEAuthorize(t *testing.T) {
	db, _ := openTestDB(t)
	var logs lockedBuffer
	var (
		mu    sync.Mutex
		calls [][]string
	)
	authorize := func(r *http.Request, topics []string) error {
		mu.Lock()
		calls = append(calls, slices.Clone(topics))
		mu.Unlock()
		if r.URL.Query().Get("token") != "good" {
			return fmt.Errorf("token %q unknown: %w", r.URL.Query().Get("token"), ErrUnauthenticated)
		}
		if len(topics) == 0 || slices.Contains(topics, "secret") {
			return errors.New("private reason 7f3a")
		}
		return nil
	}
	takeCalls := func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		c := calls
		calls = nil
		return c
	}
	h := newTestHub(t, db, Options{
		Authorize: authorize,
		Logger:    slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SSE:       SSEOptions{MaxTopics: 3, MaxConnections: 2},
	})
	var subscribed atomic.Int64
	h.testHookAfterSubscribe = func() { subscribed.Add(1) }
	srv := serve(t, h)
	mustPublish(t, h, "secret", "s")

	refusals := []struct {
		query  string
		status int
		body   string
		topics []string
	}{
		{"?topic=a&token=bad", 401, "unauthorized\n", []string{"a"}},
		{"?topic=a", 401, "unauthorized\n", []string{"a"}},
		{"?token=good", 403, "forbidden\n", []string{}},
		{"?topic=&token=good", 403, "forbidden\n", []string{}},
		{"?topic=secret&token=good", 403, "forbidden\n", []string{"secret"}},
		{"?topic=b&topic=secret&topic=b&topic=a&token=good", 403, "forbidden\n", []string{"b", "secret", "a"}},
	}
	for _, tc := range refusals {
		status, body := wiretest.Get(t, srv.URL+tc.query, wiretest.LastID(0))
		if status != tc.status || body != tc.body {
			t.Errorf("%s: %d %q, want %d %q", tc.query, status, body, tc.status, tc.body)
		}
		if got := takeCalls(); len(got) != 1 || !slices.Equal(got[0], tc.topics) {
			t.Errorf("%s: Authorize called with %q, want once with %q", tc.query, got, tc.topics)
		}
	}
	if subscribed.Load() != 0 || h.Clients().Total() != 0 || len(h.Clients().Snapshot()) != 0 {
		t.Fatalf("a refused request subscribed (%d) or reached the tracker: %+v", subscribed.Load(), h.Clients().Snapshot())
	}
	if l := logs.String(); !strings.Contains(l, "private reason 7f3a") || !strings.Contains(l, `token \"bad\" unknown`) || !strings.Contains(l, "level=DEBUG") {
		t.Errorf("the refusals' errors are not in the debug log:\n%s", l)
	}
	if h.metrics.refusedUnauthenticated.Load() != 2 || h.metrics.refusedForbidden.Load() != 4 {
		t.Errorf("refusals counted %d unauthenticated, %d forbidden", h.metrics.refusedUnauthenticated.Load(), h.metrics.refusedForbidden.Load())
	}

	// Granted: the topics in the order first requested.
	c := wiretest.Dial(t, srv.URL+"?topic=b&topic=%20a&topic=b&token=good", nil)
	c.Hello()
	if got := takeCalls(); len(got) != 1 || !slices.Equal(got[0], []string{"b", "a"}) {
		t.Fatalf("Authorize called with %q, want once with [b a]", got)
	}

	// The cheaper checks come first: a refusal by method, origin, topics or
	// the cap never reaches Authorize; neither does a preflight.
	d := wiretest.Dial(t, srv.URL+"?topic=a&token=good", nil) // the second and last slot
	d.Hello()
	takeCalls()
	for _, tc := range []struct {
		method, query, origin string
		status                int
	}{
		{"POST", "?topic=a&token=good", "", 405},
		{"GET", "?topic=a&token=good", "http://evil.example", 403},
		{"OPTIONS", "?topic=a&token=good", srv.URL, 204},
		{"GET", "?topic=a;b&token=good", "", 400},
		{"GET", "?topic=a&topic=b&topic=c&topic=d&token=good", "", 400},
		{"GET", "?topic=%00&token=good", "", 400},
		{"GET", "?topic=a&token=good", "", 200}, // the overload answer
	} {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		req, _ := http.NewRequestWithContext(ctx, tc.method, srv.URL+tc.query, nil)
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != tc.status || err != nil {
			t.Errorf("%s %s: %d %q %v, want %d", tc.method, tc.query, resp.StatusCode, body, err, tc.status)
		}
		if tc.status == 200 && !strings.HasPrefix(string(body), "retry: ") {
			t.Errorf("%s %s: %q, want the overload answer", tc.method, tc.query, body)
		}
		if got := takeCalls(); len(got) != 0 {
			t.Errorf("%s %s: Authorize called with %q", tc.method, tc.query, got)
		}
	}
}

// The cost of refusing a request past MaxConnections: admission and the
// overload answer, with nothing read or subscribed.
func BenchmarkOverloadRefusal(b *testing.B) {
	db, _ := openTestDB(b)
	h := newTestHub(b, db, Options{SSE: SSEOptions{MaxConnections: 1}})
	release, ok := h.acquireSlot()
	if !ok {
		b.Fatal("no slot")
	}
	defer release()
	handler := h.Handler()
	req := httptest.NewRequest(http.MethodGet, "/events?topic=a&topic=b", nil)
	req.Header.Set("Last-Event-ID", "42")
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		if w.Code != http.StatusOK || !strings.HasPrefix(w.Body.String(), "retry: ") {
			b.Fatalf("answer %d %q", w.Code, w.Body.String())
		}
	}
}
