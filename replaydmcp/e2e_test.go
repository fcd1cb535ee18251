package replaydmcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/storage"
)

// mcpClient is the SDK's client, connected to url, recording the progress
// notifications it receives.
type mcpClient struct {
	session *mcp.ClientSession
	http    *http.Client

	mu       sync.Mutex
	progress []float64
	reached  map[int]chan struct{} // closed once len(progress) reaches the key
}

func connectClient(t *testing.T, url string, waitFor ...int) *mcpClient {
	t.Helper()
	c := &mcpClient{http: &http.Client{Transport: &http.Transport{}}, reached: map[int]chan struct{}{}}
	for _, n := range waitFor {
		c.reached[n] = make(chan struct{})
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "replaydmcp-test", Version: "v0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.progress = append(c.progress, req.Params.Progress)
			if ch := c.reached[len(c.progress)]; ch != nil {
				close(ch)
			}
		},
	})
	ctx := testCtx(t, 30*time.Second)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: c.http, MaxRetries: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.session = cs
	t.Cleanup(func() {
		cs.Close()
		c.http.CloseIdleConnections()
	})
	return c
}

// callCount calls the tool "count" on a goroutine; its outcome arrives on
// the channel returned.
func (c *mcpClient) callCount(ctx context.Context, n, intervalMS int) <-chan error {
	done := make(chan error, 1)
	go func() {
		params := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": n, "interval_ms": intervalMS}}
		params.SetProgressToken("p")
		res, err := c.session.CallTool(ctx, params)
		if err == nil && res.IsError {
			err = fmt.Errorf("tool error: %v", res.Content)
		}
		done <- err
	}()
	return done
}

func (c *mcpClient) wait(t *testing.T, n int) {
	t.Helper()
	select {
	case <-c.reached[n]:
	case <-time.After(30 * time.Second):
		t.Fatalf("the client did not receive %d progress notifications in 30s (got %v)", n, c.got())
	}
}

// settle waits, boundedly, until the client has handled n progress
// notifications: the SDK hands them to the handler in order on a goroutine
// of its own, so the last ones may still be queued when the call returns.
func (c *mcpClient) settle(n int) []float64 {
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for len(c.got()) < n && time.Now().Before(deadline) {
		<-tick.C
	}
	return c.got()
}

func (c *mcpClient) got() []float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]float64(nil), c.progress...)
}

// checkExactlyOnce fails unless got is 1, 2, ..., n: every progress
// notification exactly once, in order.
func checkExactlyOnce(t *testing.T, got []float64, n int) {
	t.Helper()
	if len(got) != n {
		t.Errorf("received %d progress notifications, want %d: %v", len(got), n, got)
	}
	for i, p := range got {
		if p != float64(i+1) {
			t.Fatalf("progress notification %d is %v, want %d (a duplicate, a hole or a reordering): %v", i, p, i+1, got)
		}
	}
}

func awaitCall(t *testing.T, done <-chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("the tool call did not end in %v", d)
		return nil
	}
}

// The baseline: with no crash, the call streams every progress
// notification and returns.
func TestE2ECallCompletes(t *testing.T) {
	path := tempDB(t)
	_, addr := startChild(t, childConfig{Addr: "127.0.0.1:0", DB: path})
	c := connectClient(t, "http://"+addr)
	if err := awaitCall(t, c.callCount(testCtx(t, 60*time.Second), 20, 1), 60*time.Second); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, c.settle(20), 20)
}

// restartMidCall runs a call of 1000 steps through the proxy, which
// freezes once it has forwarded 5 progress notifications (the client
// misses what follows), SIGKILLs the server once the log holds 20, runs
// between (with the log, before the restart), and restarts the server on
// the same file and port. It returns the outcome of the call and what the
// log held at the kill.
func restartMidCall(t *testing.T, plain bool, between func(st storage.Store)) (c *mcpClient, stored []float64, callErr error) {
	path := tempDB(t)
	child, addr := startChild(t, childConfig{Addr: "127.0.0.1:0", DB: path, Plain: plain})
	px := newProxy(t, "http://"+addr)
	px.freezeAfter(5)
	c = connectClient(t, px.URL, 5)
	done := c.callCount(testCtx(t, 120*time.Second), 1000, 5)
	c.wait(t, 5)
	st := openSQLite(t, path) // another process's view of the file
	waitStored(t, st, 20)
	child.Kill()
	child.Wait()
	stored = storedProgress(t, st)
	if between != nil {
		between(st)
	}
	px.thaw()
	startChild(t, childConfig{Addr: addr, DB: path, Plain: plain})
	callErr = awaitCall(t, done, 90*time.Second)
	return c, stored, callErr
}

// SIGKILLed mid-call and restarted on the same SQLite file and port, the
// server (Handler) serves the client's GET with Last-Event-ID: the client
// receives every progress notification the first process stored, exactly
// once and in order, the 15 or more it missed included. The call itself
// died with its process: the SDK client ends it with an error once a
// reconnection brings nothing ("request terminated without response"),
// never with a silent hole.
func TestE2ERestartResumes(t *testing.T) {
	c, stored, err := restartMidCall(t, false, nil)
	checkExactlyOnce(t, stored, len(stored))
	if len(stored) < 20 {
		t.Fatalf("the log held %d progress notifications at the kill, want >= 20", len(stored))
	}
	checkExactlyOnce(t, c.settle(len(stored)), len(stored))
	if err == nil {
		t.Fatal("the call whose process was killed returned no error")
	}
	t.Logf("received %d of %d stored (5 before the freeze), then: %v", len(c.got()), len(stored), err)
}

// As above, but the log is pruned to its newest 3 rows before the restart:
// the session's records went with the oldest rows, so the restarted server
// does not know the session (404) and the client ends it
// (mcp.ErrSessionMissing), having only the 5 it received before the freeze.
func TestE2ERestartSessionPruned(t *testing.T) {
	c, _, err := restartMidCall(t, false, func(st storage.Store) {
		ctx := testCtx(t, 30*time.Second)
		if _, err := New(st, Options{Retention: storage.RetentionPolicy{MaxEvents: 3}}).Prune(ctx); err != nil {
			t.Fatal(err)
		}
	})
	checkExactlyOnce(t, c.settle(5), 5)
	if !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("got %v, want mcp.ErrSessionMissing", err)
	}
}

// The SDK's own handler, with the same durable store, cannot resume across
// the restart: it keeps sessions in memory, answers the client's GET for
// the session with 404, and the client takes that for the session's end
// (mcp.ErrSessionMissing).
func TestE2ERestartPlainSDKHandler(t *testing.T) {
	c, _, err := restartMidCall(t, true, nil)
	checkExactlyOnce(t, c.settle(5), 5)
	if !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("got %v, want mcp.ErrSessionMissing", err)
	}
}

// Without a restart: the call's response is cut once the client has 5
// progress notifications, and the log is pruned (by another process on
// the file) past the 6th before the client reconnects. The server, which
// still has the session, gets ErrEventsPurged from After and answers the
// SDK's 400 ("failed to replay events"); the client fails the call and
// has only the 5: no notification after a hole.
func TestE2EPurgedAfterCut(t *testing.T) {
	path := tempDB(t)
	_, addr := startChild(t, childConfig{Addr: "127.0.0.1:0", DB: path})
	px := newProxy(t, "http://"+addr)
	px.freezeAfter(5)
	c := connectClient(t, px.URL, 5)
	done := c.callCount(testCtx(t, 120*time.Second), 1000, 5)
	c.wait(t, 5)
	st := openSQLite(t, path)
	waitStored(t, st, 20)
	if _, err := New(st, Options{Retention: storage.RetentionPolicy{MaxEvents: 3}}).Prune(testCtx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	px.thaw()
	// End the call's response only: the client's standalone GET stays,
	// as a reconnection of it racing the server's release of the old one
	// would get a 409 and end the session before the call's resumption.
	px.cut(http.MethodPost)
	err := awaitCall(t, done, 90*time.Second)
	checkExactlyOnce(t, c.settle(5), 5)
	if err == nil || !strings.Contains(err.Error(), "Bad Request") {
		t.Fatalf("got %v, want the client's error for the server's 400", err)
	}
	t.Logf("after the purge: %v", err)
}
