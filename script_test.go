package replayd

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// clientGet sends one request to a real server running ClientScript.
func clientGet(t *testing.T, srv *httptest.Server, method string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	return wiretest.Do(t, srv.Client(), method, srv.URL+"/replayd.js", header, waitFor)
}

func TestClientScriptHeaders(t *testing.T) {
	srv := httptest.NewServer(ClientScript())
	t.Cleanup(srv.Close)

	resp, body := clientGet(t, srv, http.MethodGet, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: status %d", resp.StatusCode)
	}
	if !bytes.Equal(body, clientJS) || len(body) == 0 {
		t.Fatalf("GET: body of %d bytes differs from the embedded module (%d bytes)", len(body), len(clientJS))
	}
	if !bytes.Contains(body, []byte("export function subscribe(")) {
		t.Fatal("the module does not export subscribe")
	}
	if !bytes.Contains(body, []byte("export function followJob(")) {
		t.Fatal("the module does not export followJob")
	}
	for k, want := range map[string]string{
		"Content-Type":           "text/javascript; charset=utf-8",
		"Cache-Control":          "no-cache",
		"X-Content-Type-Options": "nosniff",
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	etag := resp.Header.Get("ETag")
	if len(etag) < 10 || !strings.HasPrefix(etag, `"`) || !strings.HasSuffix(etag, `"`) {
		t.Fatalf("ETag %q is not a strong validator", etag)
	}

	// HEAD: the same headers, no body.
	head, body := clientGet(t, srv, http.MethodHead, nil)
	if head.StatusCode != http.StatusOK || len(body) != 0 || head.Header.Get("ETag") != etag ||
		head.Header.Get("Content-Type") != "text/javascript; charset=utf-8" {
		t.Fatalf("HEAD: status %d, %d body bytes, headers %v", head.StatusCode, len(body), head.Header)
	}

	// Revalidation: the ETag (alone, in a list, weak-compared, or *) gets
	// 304 with no body; any other gets the module.
	for _, inm := range []string{etag, `"other", ` + etag, "W/" + etag, "*"} {
		resp, body := clientGet(t, srv, http.MethodGet, http.Header{"If-None-Match": {inm}})
		if resp.StatusCode != http.StatusNotModified || len(body) != 0 {
			t.Errorf("If-None-Match %s: status %d with %d body bytes, want 304 and none", inm, resp.StatusCode, len(body))
		}
		if resp.Header.Get("ETag") != etag {
			t.Errorf("If-None-Match %s: 304 without the ETag: %v", inm, resp.Header)
		}
	}
	resp, body = clientGet(t, srv, http.MethodGet, http.Header{"If-None-Match": {`"stale"`}})
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, clientJS) {
		t.Fatalf("stale If-None-Match: status %d, %d bytes", resp.StatusCode, len(body))
	}

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions} {
		resp, _ := clientGet(t, srv, m, nil)
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: status %d, Allow %q; want 405 with Allow: GET, HEAD", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

// The ETag is a hash of the content: another module gets another one.
func TestClientScriptETagIsContentHash(t *testing.T) {
	if clientETag != clientContentTag(clientJS) {
		t.Fatalf("ETag %s is not the hash of the module", clientETag)
	}
	if clientContentTag([]byte("export {}")) == clientETag {
		t.Fatal("a different module hashes to the same ETag")
	}
}

// The module parses as an ES module (node --check on a .mjs copy).
func TestClientScriptParses(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found; cannot check the module's syntax")
	}
	path := filepath.Join(t.TempDir(), "replayd.mjs")
	if err := os.WriteFile(path, clientJS, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(node, "--check", path).CombinedOutput(); err != nil {
		t.Fatalf("node --check: %v\n%s", err, out)
	}
}
