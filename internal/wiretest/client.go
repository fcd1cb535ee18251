package wiretest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// WaitFor bounds every wait in replayd's tests.
const WaitFor = 10 * time.Second

// Client reads frames from one SSE response, parsed the way an
// EventSource does (ReadFrames).
type Client struct {
	t      testing.TB
	resp   *http.Response
	frames chan Frame
	errc   chan error
	cancel context.CancelFunc
}

// Dial opens an SSE stream at url with the given request headers and
// fails the test unless it answers 200.
func Dial(t testing.TB, url string, header http.Header) *Client {
	t.Helper()
	c, status := DialStatus(t, url, header)
	if status != http.StatusOK {
		t.Fatalf("GET %s: status %d", url, status)
	}
	return c
}

// DialStatus opens an SSE stream and returns its status; the client is nil
// unless the status is 200.
func DialStatus(t testing.TB, url string, header http.Header) (*Client, int) {
	t.Helper()
	return DialClientStatus(t, http.DefaultClient, url, header)
}

// DialClientStatus is DialStatus with a given HTTP client. The stream is
// closed at the end of the test.
func DialClientStatus(t testing.TB, client *http.Client, url string, header http.Header) (*Client, int) {
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
	c := &Client{t: t, resp: resp, frames: make(chan Frame, 1<<16), errc: make(chan error, 1), cancel: cancel}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.errc <- ReadFrames(resp.Body, c.frames)
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	return c, resp.StatusCode
}

// Response is the stream's response; its body is the client's to read.
func (c *Client) Response() *http.Response { return c.resp }

// Close drops the connection.
func (c *Client) Close() {
	c.cancel()
	c.resp.Body.Close()
}

// Next returns the next frame, failing the test if none comes in time or
// the stream ends.
func (c *Client) Next() Frame {
	c.t.Helper()
	f, err := c.NextErr(WaitFor)
	if err != nil {
		c.t.Fatalf("next frame: %v", err)
	}
	return f
}

// NextIs returns the next frame, failing the test unless it is the event
// with sequence seq; what names the frame in the message.
func (c *Client) NextIs(seq int64, what string) Frame {
	c.t.Helper()
	f := c.Next()
	if f.ID != fmt.Sprint(seq) {
		c.t.Fatalf("%s: frame %+v, want event %d", what, f, seq)
	}
	return f
}

// ErrTimeout is NextErr's error when no frame came in time.
var ErrTimeout = errors.New("timed out waiting for a frame")

// NextErr returns the next frame, or the error that ended the stream, or
// ErrTimeout after d.
func (c *Client) NextErr(d time.Duration) (Frame, error) {
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
		return Frame{}, err
	case <-timer.C:
		return Frame{}, ErrTimeout
	}
}

// NextNonHeartbeat is Next, skipping heartbeats.
func (c *Client) NextNonHeartbeat() Frame {
	c.t.Helper()
	for {
		if f := c.Next(); f.Event != "heartbeat" {
			return f
		}
	}
}

// Hello reads the hello frame and returns its data.
func (c *Client) Hello() (f Frame, topic *string, cursor, head int64) {
	c.t.Helper()
	f = c.NextNonHeartbeat()
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

// Events reads n frames, skipping heartbeats, and returns them.
func (c *Client) Events(n int) []Frame {
	c.t.Helper()
	out := make([]Frame, 0, n)
	for len(out) < n {
		out = append(out, c.NextNonHeartbeat())
	}
	return out
}

// Quiet asserts that no frame but heartbeats arrives within d.
func (c *Client) Quiet(d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		f, err := c.NextErr(time.Until(deadline))
		if errors.Is(err, ErrTimeout) {
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

// MustGap parses a gap frame, failing the test unless f is one with all
// six keys and no id.
func MustGap(t testing.TB, f Frame) Gap {
	t.Helper()
	if f.Event != "gap" || f.HasID {
		t.Fatalf("want a gap frame without id, got %+v", f)
	}
	g, err := ParseGap(f.Data)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// FrameIDs returns the frames' ids.
func FrameIDs(fs []Frame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.ID
	}
	return out
}

// LastID is a Last-Event-ID header naming id.
func LastID(id int64) http.Header { return http.Header{"Last-Event-ID": {fmt.Sprint(id)}} }

// Ended waits for the stream to end, failing the test if an event arrives
// or it has not ended within WaitFor (heartbeats do not count); what names
// the stream in the message.
func (c *Client) Ended(what string) {
	c.t.Helper()
	deadline := time.Now().Add(WaitFor) // heartbeats do not extend it
	for {
		f, err := c.NextErr(time.Until(deadline))
		switch {
		case errors.Is(err, ErrTimeout):
			c.t.Fatalf("%s: the stream neither ended nor delivered", what)
		case err != nil:
			return
		case f.Event != "heartbeat":
			c.t.Fatalf("%s: the stream went on with %+v", what, f)
		}
	}
}

// Rest reads the stream to its clean end and returns every frame read on
// the way, failing the test if it does not end within WaitFor or ends
// otherwise.
func (c *Client) Rest() []Frame {
	c.t.Helper()
	var fs []Frame
	for {
		f, err := c.NextErr(WaitFor)
		switch {
		case errors.Is(err, io.EOF):
			return fs
		case err != nil:
			c.t.Fatalf("after %d frames: %v; want the stream to end", len(fs), err)
		}
		fs = append(fs, f)
	}
}
