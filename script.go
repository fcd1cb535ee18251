package replayd

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"time"
)

// clientJS is the browser module: subscribe() over SSE, long polls, or SSE
// falling back to long polls (docs/browser.md), and followJob() over it
// (docs/jobs.md).
//
//go:embed client.js
var clientJS []byte

// clientETag is the strong validator of clientJS: a hash of its bytes, so
// it changes exactly when the module does.
var clientETag = clientContentTag(clientJS)

// clientContentTag is the strong ETag of content: 144 bits of its SHA-256.
func clientContentTag(content []byte) string {
	sum := sha256.Sum256(content)
	return `"` + base64.RawURLEncoding.EncodeToString(sum[:18]) + `"`
}

// ClientScript returns a handler serving the browser module, an ES module
// exporting subscribe (docs/browser.md in the repository describes its
// options) and followJob, which follows a job stream (docs/jobs.md). Mount it where
// pages import it from, for example
//
//	mux.Handle("/replayd.js", replayd.ClientScript())
//
// and in the page
//
//	import { subscribe } from "/replayd.js";
//
// It answers GET and HEAD with Content-Type text/javascript, a strong ETag
// (a hash of the module) and Cache-Control no-cache, so a browser keeps its
// copy and revalidates it with If-None-Match, getting 304 until the module
// changes. Other methods get 405.
func ClientScript() http.Handler {
	return http.HandlerFunc(serveClientScript)
}

func serveClientScript(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/javascript; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", clientETag)
	h.Set("X-Content-Type-Options", "nosniff")
	// ServeContent answers If-None-Match (304), HEAD and Range against the
	// ETag; the zero time sends no Last-Modified.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(clientJS))
}
