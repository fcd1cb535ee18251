package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	ldes "github.com/launchdarkly/eventsource"
	r3sse "github.com/r3labs/sse/v2"
	gosse "github.com/tmaxmax/go-sse"
	"gopkg.in/cenkalti/backoff.v1"
)

// The clients under test, each driven the way its documentation shows,
// with the settings docs/clients.md names and otherwise its defaults.

// frame is what a client handed the application.
type frame struct{ typ, id, data string }

// recorder collects what a client handed the application, and whether it
// gave up by itself.
type recorder struct {
	board
	frames  []frame // guarded by mu
	stopped bool    // guarded by mu: the client ended without being asked
	err     error   // guarded by mu: why it stopped
}

func (r *recorder) add(typ, id, data string) {
	r.update(func() { r.frames = append(r.frames, frame{typ, id, data}) })
}

func (r *recorder) stop(err error) {
	r.update(func() { r.stopped, r.err = true, err })
}

// has reports, under the lock, whether an event of type "message" with id
// was handed over.
func (r *recorder) has(id string) bool { return hasMessage(r.frames, id) }

func hasMessage(frames []frame, id string) bool {
	return slices.ContainsFunc(frames, func(f frame) bool { return f.typ == "message" && f.id == id })
}

func (r *recorder) snapshot() ([]frame, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]frame(nil), r.frames...), r.stopped, r.err
}

// client runs one subscription to url, reporting to rec, until ctx ends or
// the client gives up; it returns when the client has let go.
type client struct {
	name string
	run  func(ctx context.Context, t *testing.T, url string, rec *recorder)
}

var clients = []client{
	{"r3labs/sse", r3labs()},
	{"r3labs/sse+loop", runR3labsLoop},
	{"launchdarkly/eventsource", runLaunchDarkly},
	{"tmaxmax/go-sse", goSSE(0)},
	{"tmaxmax/go-sse+loop", runGoSSELoop},
	{"npm eventsource", runNode},
	{"npm eventsource+reopen", runNodeReopen},
}

// r3labs subscribes with a ReconnectStrategy bound to ctx: without it a
// cancelled subscription goes on retrying for the back-off's 15 minutes.
func r3labs(opts ...func(*r3sse.Client)) func(ctx context.Context, t *testing.T, url string, rec *recorder) {
	return func(ctx context.Context, t *testing.T, url string, rec *recorder) {
		c := r3sse.NewClient(url, opts...)
		c.ReconnectStrategy = backoff.WithContext(backoff.NewExponentialBackOff(), ctx)
		err := c.SubscribeRawWithContext(ctx, func(m *r3sse.Event) {
			rec.add(string(m.Event), string(m.ID), string(m.Data))
		})
		if ctx.Err() == nil {
			rec.stop(fmt.Errorf("Subscribe returned %v", err))
		}
	}
}

// runR3labsLoop is the work-around for r3labs/sse: subscribe again when
// Subscribe returns. The client keeps LastEventID across calls, so the new
// subscription resumes.
func runR3labsLoop(ctx context.Context, t *testing.T, url string, rec *recorder) {
	c := r3sse.NewClient(url)
	c.ReconnectStrategy = backoff.WithContext(backoff.NewExponentialBackOff(), ctx)
	for {
		_ = c.SubscribeRawWithContext(ctx, func(m *r3sse.Event) {
			rec.add(string(m.Event), string(m.ID), string(m.Data))
		})
		select {
		case <-ctx.Done():
			return
		case <-time.After(loopWait):
		}
	}
}

// loopWait is the pause between two rounds of a work-around's loop; an
// application would wait longer (the overload answer asks for 5-10 s).
const loopWait = 200 * time.Millisecond

// runLaunchDarkly: an error handler, or the stream blocks until someone
// reads its Errors channel.
func runLaunchDarkly(ctx context.Context, t *testing.T, url string, rec *recorder) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Error(err)
		return
	}
	s, err := ldes.SubscribeWithRequestAndOptions(req,
		ldes.StreamOptionErrorHandler(func(error) ldes.StreamErrorHandlerResult {
			return ldes.StreamErrorHandlerResult{CloseNow: false}
		}))
	if err != nil {
		rec.stop(err)
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		s.Close()
	}()
	for ev := range s.Events {
		rec.add(ev.Event(), ev.Id(), ev.Data())
	}
	if ctx.Err() == nil {
		rec.stop(errors.New("Events closed"))
	}
	wg.Wait()
}

// goSSE connects with tmaxmax/go-sse's defaults; maxEvent > 0 raises its
// scanner's limit (Connection.Buffer).
func goSSE(maxEvent int) func(ctx context.Context, t *testing.T, url string, rec *recorder) {
	return func(ctx context.Context, t *testing.T, url string, rec *recorder) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Error(err)
			return
		}
		conn := (&gosse.Client{}).NewConnection(req)
		if maxEvent > 0 {
			conn.Buffer(nil, maxEvent)
		}
		conn.SubscribeToAll(func(e gosse.Event) {
			rec.add(e.Type, e.LastEventID, e.Data) // the last id seen, not the frame's own
		})
		err = conn.Connect()
		if ctx.Err() == nil {
			rec.stop(err)
		}
	}
}

// runGoSSELoop is the work-around for tmaxmax/go-sse: call Connect again
// on the same Connection when it returns. The Connection keeps the last
// event id, and sends it.
func runGoSSELoop(ctx context.Context, t *testing.T, url string, rec *recorder) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Error(err)
		return
	}
	conn := (&gosse.Client{}).NewConnection(req)
	conn.SubscribeToAll(func(e gosse.Event) { rec.add(e.Type, e.LastEventID, e.Data) })
	for {
		_ = conn.Connect()
		select {
		case <-ctx.Done():
			return
		case <-time.After(loopWait):
		}
	}
}

// node is the npm client's install: a directory with node_modules, made
// once per test binary.
var node struct {
	once sync.Once
	dir  string
	err  error // why it cannot run
}

// nodeDir installs testdata/node's locked dependencies into a temporary
// directory. Without Node.js the npm client is skipped, except under
// CI=true, where it fails.
func nodeDir(t *testing.T) string {
	t.Helper()
	node.once.Do(func() {
		if _, err := exec.LookPath("node"); err != nil {
			node.err = fmt.Errorf("node is not installed: %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "replayd-interop-node")
		if err != nil {
			node.err = err
			return
		}
		node.dir = dir
		for _, f := range []string{"package.json", "package-lock.json", "client.mjs"} {
			b, err := os.ReadFile(filepath.Join("testdata", "node", f))
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, f), b, 0o644)
			}
			if err != nil {
				node.err = err
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			node.err = fmt.Errorf("npm ci: %v: %s", err, out)
		}
	})
	if node.err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("npm eventsource: %v", node.err)
		}
		t.Skipf("npm eventsource: %v (with CI=true this fails)", node.err)
	}
	return node.dir
}

// runNode runs testdata/node/client.mjs, which prints one JSON object a
// line for each event and error the EventSource dispatches.
func runNode(ctx context.Context, t *testing.T, url string, rec *recorder) {
	nodeClient(ctx, t, rec, url)
}

// runNodeReopen opens a new EventSource, from the last id, when one gives
// up.
func runNodeReopen(ctx context.Context, t *testing.T, url string, rec *recorder) {
	nodeClient(ctx, t, rec, url, "reopen")
}

func nodeClient(ctx context.Context, t *testing.T, rec *recorder, args ...string) {
	dir := nodeDir(t)
	cmd := exec.CommandContext(ctx, "node", append([]string{"client.mjs"}, args...)...)
	cmd.Dir = dir
	cmd.WaitDelay = 2 * time.Second
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Error(err)
		return
	}
	if err := cmd.Start(); err != nil {
		t.Error(err)
		return
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 4<<20) // lines carry whole payloads
	for sc.Scan() {
		var m struct {
			Type, ID, Data string
			ReadyState     int
			Message        string
			Reopen         bool
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("node: %q: %v", sc.Bytes(), err)
			continue
		}
		if m.Type == "error" {
			if m.ReadyState == 2 && !m.Reopen && ctx.Err() == nil { // CLOSED: it gave up
				rec.stop(errors.New(m.Message))
			}
			continue
		}
		rec.add(m.Type, m.ID, m.Data)
	}
	_ = cmd.Wait() // killed when ctx ends
	if ctx.Err() == nil {
		rec.stop(errors.New("node exited"))
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if node.dir != "" {
		os.RemoveAll(node.dir)
	}
	os.Exit(code)
}
