package replayd

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// Request admission (SPEC §9, §10) over real HTTP: strict topic parsing,
// the connection cap and its overload answer, and Options.Authorize.

// get sends a GET and returns its status and body, read whole: it fails
// the test on a transport error or an answer that does not end within
// waitFor (a stream served where a refusal was due).
func get(t testing.TB, u string, header http.Header) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: status %d, read the body: %v", u, resp.StatusCode, err)
	}
	return resp.StatusCode, string(body)
}

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

// A query that does not parse is refused: net/url drops a malformed pair,
// so "?topic=a;b" would otherwise be served as a global stream of every
// topic (issue 8, item 6).
func TestSSETopicQueryStrict(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{MaxTopics: 3}})
	srv := serve(t, h)
	mustPublish(t, h, "a;b", "a topic Publish accepts")
	mustPublish(t, h, "other", "invisible to a;b")
	for _, q := range []string{"?topic=a;b", "?topic=a%3Bb;x=1", "?topic=a&x=%zz", "?%zz&topic=a", "?topic=a&topic=b&topic=c&topic=d"} {
		status, body := get(t, srv.URL+q, lastID(0))
		if status != http.StatusBadRequest {
			t.Errorf("%s: status %d, body %q; want 400", q, status, body)
		}
	}
	if h.Clients().Total() != 0 || len(h.Clients().Snapshot()) != 0 {
		t.Fatalf("a refused request reached the tracker: %+v", h.Clients().Snapshot())
	}

	// The topic, escaped, is served as itself.
	c := dial(t, srv.URL+"?topic="+url.QueryEscape("a;b"), lastID(0))
	if _, topic, _, _ := c.hello(); topic == nil || *topic != "a;b" {
		t.Fatalf("topic %v, want a;b", topic)
	}
	if f := c.next(); f.ID != "1" {
		t.Fatalf("got %+v, want the event of a;b", f)
	}
	c.Close()

	// Blank values are ignored and repeats count once.
	for _, q := range []string{"?topic=&topic=a", "?topic=a&topic=a", "?topic=%20a%20&topic=a&topic="} {
		c := dial(t, srv.URL+q, nil)
		if _, topic, _, _ := c.hello(); topic == nil || *topic != "a" {
			t.Errorf("%s: topic %v, want a", q, topic)
		}
		c.Close()
	}
	// MaxTopics distinct topics, repeated, are within the limit.
	c = dial(t, srv.URL+"?topic=a&topic=b&topic=c&topic=a&topic=b", nil)
	c.hello()
}
