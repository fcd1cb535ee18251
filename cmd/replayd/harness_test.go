package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/replayd/replayd/internal/testenv"
)

// The tests run the built binary as a child process, as an operator does,
// and talk to it over HTTP on 127.0.0.1.

// bin is the replayd binary TestMain builds, with buildFlags.
var (
	bin        string
	buildFlags []string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "replayd-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "replayd")
	out, err := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", bin, ".")...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	testenv.Report("cmd/replayd")
	os.RemoveAll(dir)
	os.Exit(code)
}

// waitFor bounds every wait.
const waitFor = 10 * time.Second

// testSecret is the HS256 secret of the tests' tokens.
const testSecret = "0123456789abcdef0123456789abcdef-test-secret"

// publishKey may publish everywhere; roomKey only to room-*.
const (
	publishKey = "pk-all"
	roomKey    = "pk-room"
)

// daemon is one running `replayd serve`.
type daemon struct {
	cmd  *exec.Cmd
	base string // http://127.0.0.1:port
	logs *syncBuffer
	done chan struct{} // closed when the process has exited
	err  error         // its Wait error, once done
}

// secretFile writes the tests' HS256 secret into a file.
func secretFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token.key")
	if err := os.WriteFile(p, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// serveArgs are the flags most tests run with: a database in dir, both
// publish keys, the tests' secret, public topics pub-*, and heartbeats
// rare enough that no test meets one (NextIs wants the next frame).
func serveArgs(t *testing.T, db string) []string {
	return []string{"--db", db, "--publish-key", publishKey, "--publish-key", roomKey + "=room-*",
		"--token-key", secretFile(t), "--public-topics", "pub-*", "--heartbeat", "1m"}
}

// start runs `replayd serve args…` on a free port and waits until it
// serves; it is stopped (SIGKILL) at the end of the test if still running.
func start(t *testing.T, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{logs: &syncBuffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	d.cmd.Env = append(os.Environ(), env...)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			d.logs.Write(append(line, '\n'))
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "serving" {
				addr <- rec.Addr
			}
		}
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			d.cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("replayd logs:\n%s", d.logs.String())
		}
	})
	select {
	case a := <-addr:
		d.base = "http://" + a
	case <-d.done:
		t.Fatalf("replayd exited before serving: %v\n%s", d.err, d.logs.String())
	case <-time.After(waitFor):
		t.Fatalf("replayd did not start within %v\n%s", waitFor, d.logs.String())
	}
	return d
}

// stop sends sig and waits for the process to exit, returning how long it
// took; it fails the test unless the exit status is 0.
func (d *daemon) stop(t *testing.T, sig syscall.Signal) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("replayd still running 15s after %v", sig)
	}
	if d.err != nil {
		t.Fatalf("replayd exited with %v after %v", d.err, sig)
	}
	return time.Since(t0)
}

// token mints an HS256 subscriber token for patterns, expiring at exp
// (zero: no exp claim).
func token(t *testing.T, exp time.Time, patterns ...string) string {
	t.Helper()
	claims := jwt.MapClaims{"topics": patterns, "sub": "test"}
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bearerHeader is an Authorization header carrying tok.
func bearerHeader(tok string) http.Header {
	return http.Header{"Authorization": {"Bearer " + tok}}
}

// publishAnswer is POST /publish's answer for one event.
type publishAnswer struct {
	Sequence  int64  `json:"sequence"`
	ID        string `json:"id"`
	Duplicate bool   `json:"duplicate"`
	Error     string `json:"error"`
	Code      string `json:"code"`
	Outcome   string `json:"outcome"`
}

// post sends a POST /publish with key and body and returns the status and
// body.
func post(t testing.TB, client *http.Client, base, key, contentType, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/publish", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// publish publishes one JSON event and returns its answer, failing the
// test unless it is 200.
func publish(t testing.TB, base, topic, id string, data any) publishAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"topic": topic, "id": id, "data": data})
	status, b := post(t, http.DefaultClient, base, publishKey, "application/json", string(body))
	if status != http.StatusOK {
		t.Fatalf("publish %s: %d %s", id, status, b)
	}
	var a publishAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// needTool skips the test when name is not installed, or fails it under
// CI=true.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// farFuture is an expiry no test reaches.
func farFuture() time.Time { return time.Now().Add(time.Hour) }

// modes are the ways streams are served: through net/http, and detached
// from it (--detach).
var modes = []struct {
	name string
	args []string
}{
	{"net/http", nil},
	{"detached", []string{"--detach"}},
}
