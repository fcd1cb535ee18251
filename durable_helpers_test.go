package replayd

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// Shared helpers of the Durable Streams tests (durable_*_test.go): a hub on
// a real SQLite file, served over real HTTP with the protocol's handler at
// /v1/stream/ beside Handler() at /events and PollHandler() at /poll.

// dsEnv is one hub and its server.
type dsEnv struct {
	h    *EventHub
	db   *sql.DB
	path string // the database file
	url  string // the server's base URL
}

// newDSEnv starts a hub with opts and a server mounting its handlers; with
// a zero dopts the Durable Streams handler is Open (every read and write
// allowed), as the conformance suite runs it.
func newDSEnv(t testing.TB, opts Options, dopts *DurableStreamsOptions) *dsEnv {
	t.Helper()
	db, path := openTestDB(t)
	h := newTestHub(t, db, opts)
	d := DurableStreamsOptions{Open: true}
	if dopts != nil {
		d = *dopts
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/stream/", h.DurableStreams(d))
	mux.Handle("/events", h.Handler())
	mux.Handle("/poll", h.PollHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &dsEnv{h: h, db: db, path: path, url: srv.URL}
}

// stream is the URL of the stream name.
func (e *dsEnv) stream(name string) string { return e.url + "/v1/stream/" + name }

// dsAnswer is one answer of the handler.
type dsAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a dsAnswer) String() string {
	return fmt.Sprintf("%d %q", a.status, truncate(a.body, 200))
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// dsDo sends one request to u (a full URL, sent as written) and reads its
// answer.
func dsDo(t testing.TB, method, u string, header http.Header, body []byte) dsAnswer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, u, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	return dsSend(t, req)
}

// dsSend sends req, bounded by waitFor, and reads its answer. Redirects
// are answers: they are not followed.
func dsSend(t testing.TB, req *http.Request) dsAnswer {
	t.Helper()
	client := &http.Client{
		Timeout:       2 * waitFor,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", req.Method, req.URL, err)
	}
	return dsAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// ctype is a Content-Type header.
func ctype(ct string) http.Header { return http.Header{"Content-Type": {ct}} }

// dsCreate creates the stream name with content type ct, failing the test
// unless it answers 201, and returns its offset (Stream-Next-Offset).
func (e *dsEnv) dsCreate(t testing.TB, name, ct string) string {
	t.Helper()
	a := dsDo(t, http.MethodPut, e.stream(name), ctype(ct), nil)
	if a.status != http.StatusCreated {
		t.Fatalf("PUT %s: %v", name, a)
	}
	return a.header.Get("Stream-Next-Offset")
}

// seqOf parses an offset the handler gave, failing the test unless it is
// 19 digits.
func seqOf(t testing.TB, offset string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(offset, 10, 64)
	if err != nil || len(offset) != 19 {
		t.Fatalf("offset %q: not 19 digits (%v)", offset, err)
	}
	return n
}

// dsAppend appends body to the stream name and returns the offset after
// it (Stream-Next-Offset), failing the test unless it answers 2xx.
func (e *dsEnv) dsAppend(t testing.TB, name, ct, body string) string {
	t.Helper()
	a := dsDo(t, http.MethodPost, e.stream(name), ctype(ct), []byte(body))
	if a.status/100 != 2 {
		t.Fatalf("POST %s %q: %v", name, body, a)
	}
	off := a.header.Get("Stream-Next-Offset")
	if off == "" {
		t.Fatalf("POST %s: no Stream-Next-Offset", name)
	}
	return off
}

// dsRead reads the stream name from offset (catch-up), failing the test
// unless it answers 200.
func (e *dsEnv) dsRead(t testing.TB, name, offset string) dsAnswer {
	t.Helper()
	a := dsDo(t, http.MethodGet, e.stream(name)+"?offset="+offset, nil, nil)
	if a.status != http.StatusOK {
		t.Fatalf("GET %s from %s: %v", name, offset, a)
	}
	return a
}

// offsetOf writes a sequence as an offset: 19 digits.
func offsetOf(seq int64) string { return fmt.Sprintf("%019d", seq) }

// dsModes are the three ways to read: catch-up, long-poll and SSE. Each
// answers an offset that is not a position before it would wait or stream.
var dsModes = []string{"", "&live=long-poll", "&live=sse"}

// wantGone fails the test unless a is a 410 with the JSON code, and no
// data of any stream.
func wantGone(t testing.TB, what string, a dsAnswer, code string) {
	t.Helper()
	if a.status != http.StatusGone {
		t.Fatalf("%s: %v, want 410 %s", what, a, code)
	}
	var body struct{ Error, Code string }
	if err := json.Unmarshal(a.body, &body); err != nil || body.Code != code || body.Error == "" {
		t.Fatalf("%s: body %q (%v), want the code %q and a message", what, a.body, err, code)
	}
	if a.header.Get("Stream-Next-Offset") != "" {
		t.Fatalf("%s: a 410 with Stream-Next-Offset %q", what, a.header.Get("Stream-Next-Offset"))
	}
	wantNosniff(t, what, a)
}

// wantStatus fails the test unless a has status and a plain, non-empty
// body that does not hold secret (another stream's data).
func wantStatus(t testing.TB, what string, a dsAnswer, status int, secret string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: %v, want %d", what, a, status)
	}
	if status >= 400 && len(bytes.TrimSpace(a.body)) == 0 {
		t.Fatalf("%s: %d with an empty body", what, status)
	}
	if secret != "" && strings.Contains(string(a.body), secret) {
		t.Fatalf("%s: the answer holds another stream's data: %q", what, truncate(a.body, 200))
	}
	if status >= 400 {
		wantNosniff(t, what, a)
	}
}

func wantNosniff(t testing.TB, what string, a dsAnswer) {
	t.Helper()
	if got := a.header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Fatalf("%s: X-Content-Type-Options %q, want nosniff", what, got)
	}
}

// dsSSE opens the Handler() stream of topic from the cursor after (the
// Last-Event-ID of a reconnecting EventSource) and reads its hello.
func (e *dsEnv) dsSSE(t testing.TB, topic string, after int64) *wiretest.Client {
	t.Helper()
	c := wiretest.Dial(t, e.url+"/events?topic="+topic, wiretest.LastID(after))
	c.Hello()
	return c
}
