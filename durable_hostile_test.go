package replayd

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// SPEC §19: every bad request gets the protocol's status and a clear body;
// nothing an attacker sends (offsets, paths, headers, bodies) reaches
// another stream's data or grows memory without bound.

const dsSecret = "TOPSECRET"

// newHostileEnv is an Open server with two streams: "a" holding "a-data",
// and "secret" holding dsSecret, which no request to "a" may ever see.
func newHostileEnv(t *testing.T, dopts DurableStreamsOptions) *dsEnv {
	t.Helper()
	dopts.Open = true
	e := newDSEnv(t, Options{}, &dopts)
	e.dsCreate(t, "a", "application/json")
	e.dsAppend(t, "a", "application/json", `"a-data"`)
	e.dsCreate(t, "secret", "application/json")
	e.dsAppend(t, "secret", "application/json", `"`+dsSecret+`"`)
	return e
}

// Hostile offsets are 400 in every mode, with a plain body.
func TestDurableHostileOffsets(t *testing.T) {
	e := newHostileEnv(t, DurableStreamsOptions{})
	for _, q := range []string{
		"offset=..", "offset=%00", "offset=%2500", "offset=%ff", "offset=",
		"offset=12345678901234567890", // 20 digits
		"offset=9999999999999999999",  // 19 digits, above int64
		"offset=-5", "offset=-0", "offset=1e5", "offset=0x10", "offset=+000000000000000001",
		"offset=%20000000000000000001", // a space, then 18 digits
		"offset=-1&offset=-1", "offset=now&offset=-1",
		"offset=-1%26offset=now", "offset=-1;now", "offset=%", // %: a query that does not parse
	} {
		for _, mode := range dsModes {
			a := dsDo(t, http.MethodGet, e.stream("a")+"?"+q+mode, nil, nil)
			wantStatus(t, "GET ?"+q+mode, a, http.StatusBadRequest, dsSecret)
			if strings.Contains(string(a.body), "a-data") {
				t.Fatalf("GET ?%s%s: answered with data: %q", q, mode, a.body)
			}
		}
	}
}

// Hostile paths never reach another stream: the handler refuses dot
// segments, empty segments, an encoded slash, a trailing slash, names
// over 256 bytes, invalid UTF-8 and NUL with 400. Behind a ServeMux, which
// redirects a path that is not clean before the handler sees it, the
// answer is that redirect (a client that follows it asks again, and is
// authorized again, for the stream the clean path names).
func TestDurableHostilePaths(t *testing.T) {
	e := newHostileEnv(t, DurableStreamsOptions{})
	raw := httptest.NewServer(e.h.DurableStreams(DurableStreamsOptions{Open: true}))
	t.Cleanup(raw.Close)
	paths := []string{
		"/v1/stream/../secret", "/v1/stream/a/../secret", "/v1/stream/./secret",
		"/v1/stream/a/%2E%2E/secret", "/v1/stream//secret", "/v1/stream/a%2F..%2Fsecret",
		"/v1/stream/a%2fsecret", "/v1/stream/secret/", "/v1/stream/", "/v1/stream/a%00",
		"/v1/stream/%ff%fe", "/v1/stream/" + strings.Repeat("x", 300),
		"/v1/stream/" + strings.Repeat("x", 200) + "/" + strings.Repeat("y", 100),
	}
	for _, p := range paths {
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodHead, http.MethodDelete} {
			var body []byte
			if m == http.MethodPost || m == http.MethodPut {
				body = []byte(`"x"`)
			}
			// The handler itself, mounted at the server's root.
			a := dsDo(t, m, raw.URL+p+"?offset=-1", ctype("application/json"), body)
			if m == http.MethodHead {
				if a.status != http.StatusBadRequest {
					t.Fatalf("raw %s %s: %v, want 400", m, p, a)
				}
			} else {
				wantStatus(t, "raw "+m+" "+p, a, http.StatusBadRequest, dsSecret)
			}
			// Behind the mux.
			a = dsDo(t, m, e.url+p+"?offset=-1", ctype("application/json"), body)
			switch a.status {
			case http.StatusBadRequest, http.StatusNotFound, http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			default:
				t.Fatalf("mux %s %s: %v", m, p, a)
			}
			if strings.Contains(string(a.body), dsSecret) {
				t.Fatalf("mux %s %s: another stream's data: %q", m, p, a.body)
			}
		}
	}
	// Nothing was written to either stream.
	if a := e.dsRead(t, "secret", "-1"); string(a.body) != `["`+dsSecret+`"]` {
		t.Fatalf("secret after the hostile paths: %s", a.body)
	}
	if a := e.dsRead(t, "a", "-1"); string(a.body) != `["a-data"]` {
		t.Fatalf("a after the hostile paths: %s", a.body)
	}
}

// A body over MaxBody is 413, on PUT and POST, declared or chunked, and
// the server reads no more of it than the bound: the heap stays small
// while a client sends 64 MiB.
func TestDurableHostileHugeBody(t *testing.T) {
	const maxBody = 1 << 20
	e := newHostileEnv(t, DurableStreamsOptions{MaxBody: maxBody})
	big := bytes.Repeat([]byte("x"), maxBody+1)
	e.dsCreate(t, "t", "text/plain")
	for _, m := range []string{http.MethodPut, http.MethodPost} {
		name := "t"
		if m == http.MethodPut {
			name = "new"
		}
		a := dsDo(t, m, e.stream(name), ctype("text/plain"), big)
		wantStatus(t, m+" of MaxBody+1 bytes", a, http.StatusRequestEntityTooLarge, "")
	}
	// Exactly MaxBody is taken.
	if a := dsDo(t, http.MethodPost, e.stream("t"), ctype("text/plain"), big[:maxBody]); a.status/100 != 2 {
		t.Fatalf("POST of MaxBody bytes: %v", a)
	}
	_, peak := wiretest.PeakHeap(func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.stream("t"), io.LimitReader(zeros{}, 64<<20))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain")
		client := &http.Client{Timeout: 2 * waitFor}
		resp, err := client.Do(req)
		if err != nil {
			// The server may close the connection while the client still
			// writes: what it answered is then lost, but not what it kept.
			t.Logf("chunked 64 MiB POST: %v", err)
			return
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked 64 MiB POST: %d, want 413", resp.StatusCode)
		}
	})
	t.Logf("heap peak while a client sent 64 MiB (MaxBody 1 MiB): %s", wiretest.MiB(peak))
	if peak > 16<<20 {
		t.Fatalf("heap rose %s while a client sent 64 MiB with MaxBody 1 MiB", wiretest.MiB(peak))
	}
	// Only the one MaxBody append is in the stream.
	if a := e.dsRead(t, "t", "-1"); len(a.body) != maxBody {
		t.Fatalf("stream holds %d bytes, want %d", len(a.body), maxBody)
	}
}

// zeros reads as an endless run of '0'.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '0'
	}
	return len(p), nil
}

// A JSON body nested 100k deep is refused with 400, and the server goes on.
func TestDurableHostileDeepJSON(t *testing.T) {
	e := newHostileEnv(t, DurableStreamsOptions{})
	const depth = 100_000
	for what, body := range map[string]string{
		"arrays":           strings.Repeat("[", depth) + strings.Repeat("]", depth),
		"objects":          strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth),
		"array of objects": "[" + strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth) + "]",
	} {
		for _, m := range []string{http.MethodPost, http.MethodPut} {
			name := "a"
			if m == http.MethodPut {
				name = "deep"
			}
			a := dsDo(t, m, e.stream(name), ctype("application/json"), []byte(body))
			wantStatus(t, m+" of "+what+" nested 100k deep", a, http.StatusBadRequest, dsSecret)
		}
	}
	if a := e.dsRead(t, "a", "-1"); string(a.body) != `["a-data"]` {
		t.Fatalf("a after the deep bodies: %s", a.body)
	}
}

// Invalid producer headers are 400 and append nothing.
func TestDurableHostileProducerHeaders(t *testing.T) {
	e := newHostileEnv(t, DurableStreamsOptions{})
	for _, h := range []map[string][]string{
		{"Producer-Id": {"p"}},
		{"Producer-Id": {"p"}, "Producer-Epoch": {"0"}},
		{"Producer-Epoch": {"0"}, "Producer-Seq": {"0"}},
		{"Producer-Id": {""}, "Producer-Epoch": {"0"}, "Producer-Seq": {"0"}},
		{"Producer-Id": {strings.Repeat("p", 300)}, "Producer-Epoch": {"0"}, "Producer-Seq": {"0"}},
		{"Producer-Id": {"p"}, "Producer-Epoch": {"-1"}, "Producer-Seq": {"0"}},
		{"Producer-Id": {"p"}, "Producer-Epoch": {"1e5"}, "Producer-Seq": {"0"}},
		{"Producer-Id": {"p"}, "Producer-Epoch": {"0"}, "Producer-Seq": {"9007199254740992"}}, // 2^53
		{"Producer-Id": {"p"}, "Producer-Epoch": {"0"}, "Producer-Seq": {"99999999999999999999"}},
		{"Producer-Id": {"p"}, "Producer-Epoch": {"0"}, "Producer-Seq": {"0x1"}},
	} {
		hdr := http.Header{"Content-Type": {"application/json"}}
		for k, v := range h {
			hdr[k] = v
		}
		a := dsDo(t, http.MethodPost, e.stream("a"), hdr, []byte(`"appended"`))
		wantStatus(t, fmt.Sprint("POST with producer headers ", h), a, http.StatusBadRequest, dsSecret)
	}
	if a := e.dsRead(t, "a", "-1"); string(a.body) != `["a-data"]` {
		t.Fatalf("a after the invalid producers: %s", a.body)
	}
}

// Many streams: each reads its own data only.
func TestDurableHostileManyStreams(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	const n = 100
	names := make([]string, n)
	for i := range names {
		names[i] = "many/" + strings.Repeat("s", i%7+1) + "/" + string(rune('a'+i%26)) + "-" + strconv.Itoa(i)
		e.dsCreate(t, names[i], "application/json")
	}
	for i, name := range names {
		e.dsAppend(t, name, "application/json", `"data-`+strconv.Itoa(i)+`"`)
	}
	for i, name := range names {
		if a := e.dsRead(t, name, "-1"); string(a.body) != `["data-`+strconv.Itoa(i)+`"]` {
			t.Fatalf("%s: %s", name, a.body)
		}
	}
	// A prefix or an extension of a stream's name is not that stream.
	for _, p := range []string{"many", "many/s", names[0] + "x", names[0] + "/x"} {
		wantStatus(t, "GET "+p, dsDo(t, http.MethodGet, e.stream(p)+"?offset=-1", nil, nil), http.StatusNotFound, "data-")
	}
}

// A fork's source and offset headers are read as strictly as a request's
// path and offset: a source path that names another stream by traversal,
// or an offset of another stream, never makes a fork of it.
func TestDurableHostileForkHeaders(t *testing.T) {
	e := newHostileEnv(t, DurableStreamsOptions{})
	secretOff := e.dsRead(t, "secret", "-1").header.Get("Stream-Next-Offset")
	for i, h := range []map[string]string{
		{"Stream-Forked-From": "/v1/stream/a/../secret"},
		{"Stream-Forked-From": "/v1/stream/a%2F..%2Fsecret"},
		{"Stream-Forked-From": "/v1/stream//secret"},
		{"Stream-Forked-From": "/other/secret"},
		{"Stream-Forked-From": "secret"},
		{"Stream-Forked-From": "/v1/stream/a", "Stream-Fork-Offset": ".."},
		{"Stream-Forked-From": "/v1/stream/a", "Stream-Fork-Offset": "1e5"},
		{"Stream-Forked-From": "/v1/stream/a", "Stream-Fork-Offset": "now"},
		{"Stream-Forked-From": "/v1/stream/a", "Stream-Fork-Sub-Offset": "-1"},
		{"Stream-Fork-Offset": "-1"},
	} {
		hdr := http.Header{"Content-Type": {"application/json"}}
		for k, v := range h {
			hdr.Set(k, v)
		}
		name := "fork" + strconv.Itoa(i)
		a := dsDo(t, http.MethodPut, e.stream(name), hdr, nil)
		wantStatus(t, fmt.Sprint("PUT with ", h), a, http.StatusBadRequest, dsSecret)
		wantStatus(t, "GET of the refused fork "+name, dsDo(t, http.MethodGet, e.stream(name), nil, nil), http.StatusNotFound, dsSecret)
	}
	// A fork of a at an offset of secret's: not a position of a.
	hdr := http.Header{"Content-Type": {"application/json"}, "Stream-Forked-From": {"/v1/stream/a"}, "Stream-Fork-Offset": {secretOff}}
	a := dsDo(t, http.MethodPut, e.stream("forkx"), hdr, nil)
	if a.status/100 == 2 {
		if r := e.dsRead(t, "forkx", "-1"); strings.Contains(string(r.body), dsSecret) {
			t.Fatalf("a fork of a at secret's offset reads secret's data: %s", r.body)
		}
		t.Fatalf("a fork of a at an offset of another stream: %v, want a refusal", a)
	}
	if a.status < 400 || strings.Contains(string(a.body), dsSecret) {
		t.Fatalf("a fork of a at an offset of another stream: %v", a)
	}
	t.Logf("a fork at another stream's offset: %v", a)
}

// A method the protocol does not have is 405 with Allow.
func TestDurableHostileMethods(t *testing.T) {
	e := newHostileEnv(t, DurableStreamsOptions{})
	for _, m := range []string{http.MethodPatch, http.MethodTrace, "PROPFIND", "get"} {
		a := dsDo(t, m, e.stream("secret"), nil, nil)
		wantStatus(t, m, a, http.StatusMethodNotAllowed, dsSecret)
		if a.header.Get("Allow") == "" {
			t.Fatalf("%s: 405 without Allow", m)
		}
	}
}

// Stream-Forked-From is a path as the client writes it in a URL, so
// percent-encoded as the request's own: a stream whose name needs
// encoding can be forked with the path that reads it, and an encoded
// slash is refused there as in a request's path.
func TestDurableForkedFromEncoded(t *testing.T) {
	e := newHostileEnv(t, DurableStreamsOptions{})
	e.dsCreate(t, "a%20b", "application/json")
	e.dsAppend(t, "a%20b", "application/json", `"spaced"`)
	hdr := http.Header{"Content-Type": {"application/json"}, "Stream-Forked-From": {"/v1/stream/a%20b"}}
	if a := dsDo(t, http.MethodPut, e.stream("f"), hdr, nil); a.status != http.StatusCreated {
		t.Fatalf("fork of /v1/stream/a%%20b: %v", a)
	}
	if a := e.dsRead(t, "f", "-1"); string(a.body) != `["spaced"]` {
		t.Fatalf("fork read: %s", a.body)
	}
	for _, from := range []string{"/v1/stream/a%2F..%2Fsecret", "/v1/stream/a%2fsecret", "/v1/stream/%ff", "/v1/stream/%zz", "/v1/stream/a/%2e%2e/secret"} {
		hdr.Set("Stream-Forked-From", from)
		wantStatus(t, "fork of "+from, dsDo(t, http.MethodPut, e.stream("g"), hdr, nil), http.StatusBadRequest, dsSecret)
	}
}
