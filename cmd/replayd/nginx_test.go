package main_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/testenv"
	"github.com/replayd/replayd/internal/wiretest"
)

// docNginx is the documentation holding the nginx snippet the test runs.
const docNginx = "../../docs/server.md"

// The nginx snippet of docs/server.md, as written there, in front of the
// server: a stream's frames pass at once (the hello before any event, an
// event published later within a second, where a buffering proxy would
// hold them), a reconnect with Last-Event-ID resumes through it, a long
// poll waits and is answered through it, and publishes and the browser
// module pass. Needs Debian's nginx (found on PATH, in /usr/sbin, or at
// $REPLAYD_NGINX); .ci/run installs it.
func TestNginxSnippet(t *testing.T) {
	exe := nginxBinary(t)
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "n.db"))...)
	snippet := nginxSnippet(t)
	upstream := strings.TrimPrefix(d.base, "http://")
	base := startNginx(t, exe, strings.ReplaceAll(snippet, "127.0.0.1:8080", upstream))

	tok := token(t, farFuture(), "room-*")
	// A proxy that holds the response back holds its headers too: bounded.
	client := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: waitFor}}
	dial := func(cursor int64) *wiretest.Client {
		t.Helper()
		c, status := wiretest.DialClientStatus(t, client, base+"/events?topic=room-1&access_token="+tok, wiretest.LastID(cursor))
		if status != http.StatusOK {
			t.Fatalf("a stream through nginx: status %d", status)
		}
		return c
	}
	first := publish(t, base, "room-1", "x0", 0)
	c := dial(first.Sequence - 1)
	if got := c.Response().Header.Get("Content-Type"); !strings.HasPrefix(got, "text/event-stream") {
		t.Fatalf("Content-Type %q through nginx", got)
	}
	c.Hello()
	c.NextIs(first.Sequence, "the replayed event")
	for i := range 3 {
		sent := time.Now()
		ev := publish(t, base, "room-1", fmt.Sprint("x", i+1), i)
		c.NextIs(ev.Sequence, "a live event through nginx")
		if lat := time.Since(sent); lat > time.Second {
			t.Errorf("a live event took %v from publish to client through nginx: buffered?", lat)
		}
	}
	last := publish(t, base, "room-1", "x4", 4)
	c.NextIs(last.Sequence, "a live event")
	c.Close()

	// Published while the client is away; it comes back with its cursor.
	var want []int64
	for i := range 3 {
		want = append(want, publish(t, base, "room-1", fmt.Sprint("y", i), i).Sequence)
	}
	c = dial(last.Sequence)
	c.Hello()
	for _, seq := range want {
		c.NextIs(seq, "an event missed, resumed through nginx with Last-Event-ID")
	}
	c.Quiet(200 * time.Millisecond)

	// Polls: one reading from a cursor, and a long poll held until an
	// event is published.
	p := wiretest.Poll(t, base, "topic=room-1&cursor="+strconv.FormatInt(last.Sequence, 10)+"&access_token="+tok)
	if got := p.IDs(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a poll through nginx got %v, want %v", got, want)
	}
	answer := wiretest.PollLater(t, base, "topic=room-1&wait=20&cursor="+strconv.FormatInt(p.Cursor, 10)+"&access_token="+tok)
	time.Sleep(200 * time.Millisecond) // let the poll reach the server and wait; the answer is the same if not
	woke := publish(t, base, "room-1", "z", 0)
	if got := answer().IDs(); len(got) != 1 || got[0] != woke.Sequence {
		t.Fatalf("a long poll through nginx got %v, want [%d]", got, woke.Sequence)
	}
	c.NextIs(woke.Sequence, "the live stream after the polls")

	if status, body := wiretest.Get(t, base+"/replayd.js", nil); status != http.StatusOK || !strings.Contains(body, "export") {
		t.Errorf("/replayd.js through nginx: %d", status)
	}
}

// nginxBinary returns the nginx to run: $REPLAYD_NGINX, else nginx on PATH
// or in /usr/sbin. Without one the test is skipped, or fails under CI.
func nginxBinary(t *testing.T) string {
	if exe, err := exec.LookPath("nginx"); os.Getenv("REPLAYD_NGINX") == "" && err == nil {
		return exe
	}
	if _, err := os.Stat("/usr/sbin/nginx"); os.Getenv("REPLAYD_NGINX") == "" && err == nil {
		return "/usr/sbin/nginx"
	}
	return testenv.Need(t, "nginx", "apt-get install nginx", "REPLAYD_NGINX")[0]
}

// nginxSnippet returns the nginx block of docs/server.md's "nginx in front"
// section.
func nginxSnippet(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(docNginx)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## nginx in front\n")
	if !ok {
		t.Fatalf("%s has no section \"nginx in front\"", docNginx)
	}
	_, block, ok := strings.Cut(section, "\n```nginx\n")
	if !ok {
		t.Fatalf("%s: no nginx block in \"nginx in front\"", docNginx)
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok || !strings.Contains(block, "127.0.0.1:8080") {
		t.Fatalf("%s: the nginx block is not closed or does not proxy to 127.0.0.1:8080", docNginx)
	}
	return block
}

// startNginx runs nginx, unprivileged and in the foreground, with the
// server block holding snippet on a free port of 127.0.0.1, every path in
// a temporary directory; it returns its base URL once it answers, and
// stops it at the end of the test.
func startNginx(t *testing.T, exe, snippet string) string {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nginx binds it next; another process taking it first fails the start, not the checks
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path %[1]s/client_body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    server {
        listen %[2]s;
%[3]s
    }
}
`, dir, addr, snippet)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(exe, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", confPath)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM) // fast shutdown: a graceful one waits for open streams
		select {
		case <-done:
		case <-time.After(waitFor):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx output:\n%s\nerror.log:\n%s\nnginx.conf:\n%s", out.String(), log, conf)
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(waitFor)
	for {
		select {
		case err := <-done:
			done <- err
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %v\n%s\n%s", err, out.String(), log)
		default:
		}
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx did not answer /healthz within %v: %v", waitFor, err)
		}
		time.Sleep(20 * time.Millisecond) // nginx gives no readiness signal
	}
}
