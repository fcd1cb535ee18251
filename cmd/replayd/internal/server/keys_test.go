package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A key holding = (base64 padding) is never cut into a shorter key: the
// form is split at the last =, and a form that could mean two things is
// refused at start, naming the flag.
func TestPublishKeyWithEquals(t *testing.T) {
	const padded = "q2VqZ3JhbmRvbWtleWJ5dGVzMzQ=" // as openssl rand -base64 ends
	for _, tc := range []struct {
		arg      string
		key      string // the configured key, when accepted
		patterns string
		refusal  string // in the error, when refused
	}{
		{arg: "plain", key: "plain", patterns: "*"},
		{arg: "plain=room-*,chat", key: "plain", patterns: "room-*,chat"},
		{arg: padded + "=room-*", key: padded, patterns: "room-*"},
		{arg: padded + "=*", key: padded, patterns: "*"},
		{arg: "abc===*", key: "abc==", patterns: "*"},
		{arg: padded, refusal: "ends in ="},
		{arg: "abc==", refusal: "ends in ="},
		{arg: "k=a=b", refusal: "ambiguous"},
		{arg: "=room-*", refusal: "empty key"},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			c, err := ParseServe([]string{"--publish-key", tc.arg}, func(string) string { return "" }, nil)
			if tc.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refusal) || !strings.Contains(err.Error(), "--publish-key") {
					t.Fatalf("%q: %v, want a refusal naming --publish-key and saying %q", tc.arg, err, tc.refusal)
				}
				return
			}
			if err != nil {
				t.Fatalf("%q: %v", tc.arg, err)
			}
			if len(c.PublishKeys) != 1 {
				t.Fatalf("%q: %d keys", tc.arg, len(c.PublishKeys))
			}
			want, _ := ParsePatterns(tc.patterns)
			r, _ := http.NewRequest("POST", "/publish", nil)
			r.Header.Set("Authorization", "Bearer "+tc.key)
			got, ok := publishKeys(c.PublishKeys).lookup(r)
			if !ok || !slicesEqual(got, want) {
				t.Fatalf("%q: key %q has patterns %v (%v), want %v", tc.arg, tc.key, got, ok, want)
			}
		})
	}
}

func slicesEqual(a, b Patterns) bool {
	return strings.Join(pstrings(a), ",") == strings.Join(pstrings(b), ",")
}

func pstrings(ps Patterns) []string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return s
}

// Over HTTP: the configured base64 key publishes to its topic, and no
// truncated key does.
func TestPublishKeyWithEqualsOverHTTP(t *testing.T) {
	const padded = "bm90LWEtcmVhbC1rZXktYnV0LWxvbmc=="
	_, srv := newTestServer(t, "--publish-key", padded+"=room-*")
	for _, tc := range []struct {
		key, topic string
		status     int
	}{
		{padded, "room-1", 200},
		{strings.TrimRight(padded, "="), "=", 401},
		{strings.TrimRight(padded, "="), "room-1", 401},
	} {
		req, _ := http.NewRequest("POST", srv.URL+"/publish", strings.NewReader(`{"topic":"`+tc.topic+`","data":1}`))
		req.Header.Set("Authorization", "Bearer "+tc.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("key %q to %q: %d, want %d", tc.key, tc.topic, resp.StatusCode, tc.status)
		}
	}
}

// A publish key shorter than 16 bytes starts the server with a warning;
// a long one without.
func TestShortPublishKeyWarns(t *testing.T) {
	for _, tc := range []struct {
		key  string
		warn bool
	}{
		{"k7x=room-*", true},
		{"0123456789abcdef0123456789abcdef", false},
	} {
		c, err := ParseServe([]string{"--db", filepath.Join(t.TempDir(), "w.db"), "--publish-key", tc.key}, func(string) string { return "" }, nil)
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		s, err := New(context.Background(), c, slog.New(slog.NewJSONHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		warned := false
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec struct{ Level, Msg string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Level == "WARN" && strings.Contains(rec.Msg, "publish key") {
				warned = true
				if strings.Contains(line, strings.Split(tc.key, "=")[0]) {
					t.Errorf("the warning logs the key: %s", line)
				}
			}
		}
		if warned != tc.warn {
			t.Errorf("key %q: warned %v, want %v; logs:\n%s", tc.key, warned, tc.warn, logs.String())
		}
	}
}

// --publish-key-file holds one key a line, its patterns after white
// space: any key, padded base64 included, and patterns holding = need no
// splitting rule. A bad line is refused with its number, never its key.
func TestPublishKeyFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "keys")
	content := "# the backend's keys\n\nc2VjcmV0a2V5Zm9ycHVibGlzaA==\nhex0123456789abcdef room-*, a=b\n\tspaced-key-0123456789\t chat \n"
	if err := os.WriteFile(good, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := ParseServe([]string{"--publish-key-file", good, "--publish-key", "flagkey0123456789ab=x"}, func(string) string { return "" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"c2VjcmV0a2V5Zm9ycHVibGlzaA==": "*",
		"hex0123456789abcdef":          "room-*,a=b",
		"spaced-key-0123456789":        "chat",
		"flagkey0123456789ab":          "x",
	} {
		r, _ := http.NewRequest("POST", "/publish", nil)
		r.Header.Set("Authorization", "Bearer "+key)
		got, ok := publishKeys(c.PublishKeys).lookup(r)
		if !ok || strings.Join(pstrings(got), ",") != want {
			t.Errorf("key %q: patterns %v (%v), want %s", key, got, ok, want)
		}
	}
	for _, tc := range []struct{ content, refusal string }{
		{"secret-key-0123456789 room-*,,b\n", "line 1: empty pattern"},
		{"# none\n\n", "no key"},
	} {
		bad := filepath.Join(dir, "bad")
		if err := os.WriteFile(bad, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ParseServe([]string{"--publish-key-file", bad}, func(string) string { return "" }, nil)
		if err == nil || !strings.Contains(err.Error(), "--publish-key-file") || !strings.Contains(err.Error(), tc.refusal) || strings.Contains(err.Error(), "secret-key") {
			t.Errorf("%q: %v, want a refusal naming --publish-key-file and saying %q, not the key", tc.content, err, tc.refusal)
		}
	}
	if _, err := ParseServe([]string{"--publish-key-file", filepath.Join(dir, "absent")}, func(string) string { return "" }, nil); err == nil || !strings.Contains(err.Error(), "--publish-key-file") {
		t.Errorf("a missing file: %v", err)
	}
}
