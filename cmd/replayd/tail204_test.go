package main_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A server answering 204 No Content, the answer that stops an EventSource
// for good: replayd tail stops too, over each transport, with status 1 and
// the reason on stderr, instead of retrying forever.
func TestTailNoContentExits(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	for _, transport := range []string{"sse", "poll", "auto"} {
		t.Run(transport, func(t *testing.T) {
			tl := startTail(t, srv.URL, "--transport", transport)
			select {
			case <-tl.done:
			case <-time.After(waitFor):
				t.Fatalf("replayd tail still running %v after 204s; stderr: %s", waitFor, tl.stderr.String())
			}
			msg := tl.stderr.String()
			if code := tl.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(msg, "204 No Content: the server asks clients to stop reconnecting") {
				t.Fatalf("exit %d, stderr %q; want 1 and the 204's reason", code, msg)
			}
		})
	}
}
