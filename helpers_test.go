package replayd

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// Shared test helpers: a hub on a real SQLite file, a real HTTP server, and
// a small SSE client that parses frames the way an EventSource does.

// waitFor bounds every wait in the tests.
const waitFor = 10 * time.Second

// openTestDB opens a fresh database file in t.TempDir and closes it at the
// end of the test.
func openTestDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.db")
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

// newTestHub returns a hub on db, closed at the end of the test.
func newTestHub(t testing.TB, db *sql.DB, opts Options) *EventHub {
	t.Helper()
	if testDetach {
		opts.SSE.DetachConnections = true
	}
	h, err := New(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// secondHub opens the database file at path again, with its own pool, as
// another process would, and returns a hub on it; hub and pool are closed
// at the end of the test.
func secondHub(t testing.TB, path string, opts Options) *EventHub {
	t.Helper()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return newTestHub(t, db, opts)
}

// serve starts a real HTTP server for h's handler.
func serve(t testing.TB, h *EventHub) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func mustPublish(t testing.TB, h *EventHub, topic string, payload any, opts ...PublishOption) Event {
	t.Helper()
	ev, err := h.Publish(context.Background(), topic, payload, opts...)
	if err != nil {
		t.Fatalf("publish %q: %v", topic, err)
	}
	return ev
}

// frame is one parsed SSE frame; gapJSON a gap frame's data, with nulls
// kept as nil (internal/wiretest reads both).
type (
	frame   = wiretest.Frame
	gapJSON = wiretest.Gap
)

// sseClient reads frames from one SSE response.
type sseClient struct {
	t      testing.TB
	resp   *http.Response
	frames chan frame
	errc   chan error
	cancel context.CancelFunc
}

// dial opens an SSE stream at url with the given request headers and
// fails the test unless it answers 200.
func dial(t testing.TB, url string, header http.Header) *sseClient {
	t.Helper()
	c, status := dialStatus(t, url, header)
	if status != http.StatusOK {
		t.Fatalf("GET %s: status %d", url, status)
	}
	return c
}

// dialStatus opens an SSE stream and returns its status; the client is nil
// unless the status is 200.
func dialStatus(t testing.TB, url string, header http.Header) (*sseClient, int) {
	t.Helper()
	return dialClientStatus(t, http.DefaultClient, url, header)
}

// dialClientStatus is dialStatus with a given HTTP client.
func dialClientStatus(t testing.TB, client *http.Client, url string, header http.Header) (*sseClient, int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		return nil, resp.StatusCode
	}
	c := &sseClient{t: t, resp: resp, frames: make(chan frame, 1<<16), errc: make(chan error, 1), cancel: cancel}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.errc <- wiretest.ReadFrames(resp.Body, c.frames)
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	return c, resp.StatusCode
}

// Close drops the connection.
func (c *sseClient) Close() {
	c.cancel()
	c.resp.Body.Close()
}

// next returns the next frame, failing the test if none comes in time or
// the stream ends.
func (c *sseClient) next() frame {
	c.t.Helper()
	f, err := c.nextErr(waitFor)
	if err != nil {
		c.t.Fatalf("next frame: %v", err)
	}
	return f
}

// nextErr returns the next frame, or the error that ended the stream, or
// a timeout error after d.
func (c *sseClient) nextErr(d time.Duration) (frame, error) {
	select {
	case f := <-c.frames:
		return f, nil
	default:
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case f := <-c.frames:
		return f, nil
	case err := <-c.errc:
		// Frames parsed before the end are still delivered.
		select {
		case f := <-c.frames:
			c.errc <- err
			return f, nil
		default:
		}
		c.errc <- err
		return frame{}, err
	case <-timer.C:
		return frame{}, errTimeout
	}
}

var errTimeout = errors.New("timed out waiting for a frame")

// nextNonHeartbeat skips heartbeats.
func (c *sseClient) nextNonHeartbeat() frame {
	c.t.Helper()
	for {
		if f := c.next(); f.Event != "heartbeat" {
			return f
		}
	}
}

// hello reads the hello frame and returns its data.
func (c *sseClient) hello() (f frame, topic *string, cursor, head int64) {
	c.t.Helper()
	f = c.nextNonHeartbeat()
	if f.Event != "hello" {
		c.t.Fatalf("first frame is %q, want hello: %+v", f.Event, f)
	}
	var d struct {
		Topic  *string `json:"topic"`
		Cursor *int64  `json:"cursor"`
		Head   *int64  `json:"head"`
	}
	if err := json.Unmarshal([]byte(f.Data), &d); err != nil || d.Cursor == nil || d.Head == nil {
		c.t.Fatalf("hello data %q: %v", f.Data, err)
	}
	if f.ID != fmt.Sprint(*d.Cursor) {
		c.t.Fatalf("hello id %q differs from its cursor %d", f.ID, *d.Cursor)
	}
	return f, d.Topic, *d.Cursor, *d.Head
}

// gap parses a gap frame, failing the test unless f is one with all six keys
// and no id.
func parseGap(t testing.TB, f frame) gapJSON {
	t.Helper()
	if f.Event != "gap" || f.HasID {
		t.Fatalf("want a gap frame without id, got %+v", f)
	}
	g, err := wiretest.ParseGap(f.Data)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// events reads n event frames (skipping heartbeats) and returns their ids.
func (c *sseClient) events(n int) []frame {
	c.t.Helper()
	out := make([]frame, 0, n)
	for len(out) < n {
		out = append(out, c.nextNonHeartbeat())
	}
	return out
}

// quiet asserts that no non-heartbeat frame arrives within d.
func (c *sseClient) quiet(d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		f, err := c.nextErr(time.Until(deadline))
		if errors.Is(err, errTimeout) {
			return
		}
		if err != nil {
			c.t.Fatalf("stream ended: %v", err)
		}
		if f.Event != "heartbeat" {
			c.t.Fatalf("unexpected frame %+v", f)
		}
	}
}

func i64p(v int64) *int64 { return &v }

func seqs(evs []Event) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Sequence
	}
	return out
}

func frameIDs(fs []frame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.ID
	}
	return out
}

func lastID(id int64) http.Header { return http.Header{"Last-Event-ID": {fmt.Sprint(id)}} }

func gapString(g gapJSON) string {
	b, _ := json.Marshal(g)
	return string(b)
}
