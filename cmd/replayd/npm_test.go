package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nodeClient installs the npm eventsource package (interop/testdata/node's
// locked version) and its client script into a temporary directory.
func nodeClient(t *testing.T) string {
	t.Helper()
	needTool(t, "node")
	npm := needTool(t, "npm")
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "client.mjs"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "interop", "testdata", "node", f))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("npm ci: %v: %s", err, out)
		}
		t.Skipf("npm ci: %v: %s", err, out)
	}
	return dir
}

// The npm eventsource package, with a token in access_token, receives
// what curl publishes, and resumes by itself across a restart of the
// server on the same SQLite file: every event once, in order.
func TestNpmEventSourceAcrossRestart(t *testing.T) {
	dir := nodeClient(t)
	args := append(serveArgs(t, filepath.Join(t.TempDir(), "npm.db")), "--retry", "200ms")
	d := start(t, nil, args...)
	u := d.base + "/events?topic=room-1&access_token=" + url.QueryEscape(token(t, farFuture(), "room-*"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "client.mjs", u)
	cmd.Dir = dir
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	type line struct{ Type, ID, Data string }
	lines := make(chan line, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l line
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				lines <- l
			}
		}
	}()
	next := func(what string) line {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("%s: the node client exited", what)
				}
				if l.Type == "error" {
					continue // a reconnect
				}
				return l
			case <-time.After(waitFor):
				t.Fatalf("%s: nothing from the node client", what)
			}
		}
	}
	if l := next("hello"); l.Type != "hello" {
		t.Fatalf("first line %+v, want the hello", l)
	}
	var want []string
	for i := range 3 {
		want = append(want, fmt.Sprint(publish(t, d.base, "room-1", fmt.Sprint("before", i), i).Sequence))
	}
	for _, id := range want {
		if l := next("live"); l.Type != "message" || l.ID != id {
			t.Fatalf("got %+v, want event %s", l, id)
		}
	}
	port := strings.TrimPrefix(d.base, "http://")
	d.stop(t, syscall.SIGTERM)
	d = start(t, nil, append(args, "--listen", port)...)
	want = want[:0]
	for i := range 3 {
		want = append(want, fmt.Sprint(publish(t, d.base, "room-1", fmt.Sprint("after", i), i).Sequence))
	}
	if l := next("hello after the restart"); l.Type != "hello" {
		t.Fatalf("got %+v, want the hello of the reconnect", l)
	}
	for _, id := range want {
		if l := next("resumed"); l.Type != "message" || l.ID != id {
			t.Fatalf("got %+v, want event %s", l, id)
		}
	}
}
