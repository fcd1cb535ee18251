// Command basic shows replayd's resumable stream end to end, in one process:
//
//  1. a client on topic "room-1" streams live events;
//  2. it drops, and the server publishes more: on room-1, on another topic,
//     and a broadcast;
//  3. it reconnects with Last-Event-ID and is replayed exactly what it
//     missed in its scope, then goes live again;
//  4. it drops again, misses more events than the replay limit, and on
//     reconnecting is told so by a gap frame before the newest window.
//
// The client is a tiny SSE reader written here with net/http and bufio, so
// every frame printed is what went over the wire. Run it with
//
//	go run ./examples/basic
//
// It serves on 127.0.0.1 only, keeps its database in a temporary directory
// that it removes at exit, and exits by itself within a few seconds.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/replayd/replayd"
)

const (
	replayLimit = 5               // small, so step 4 overflows it
	frameWait   = 3 * time.Second // bounds every wait for a frame
	quietWait   = 300 * time.Millisecond
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		cancel()
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "replayd-basic-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	db, err := replayd.OpenDB(filepath.Join(dir, "events.db"))
	if err != nil {
		return err
	}
	defer db.Close()

	hub, err := replayd.New(db, replayd.Options{
		SSE: replayd.SSEOptions{ReplayLimit: replayLimit},
	})
	if err != nil {
		return err
	}
	defer hub.Close() // runs before db.Close: ends every stream first

	mux := http.NewServeMux()
	mux.Handle("/events", hub.Handler())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // ErrServerClosed after Shutdown
	defer func() {
		hub.Close() // end the streams first, or Shutdown would wait for them
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
	}()
	url := "http://" + ln.Addr().String() + "/events?topic=room-1"

	fmt.Println("replayd basic example")
	fmt.Println("  database:    ", filepath.Join(dir, "events.db"))
	fmt.Println("  stream:      ", url)
	fmt.Println("  replay limit:", replayLimit)
	fmt.Println("  ids:          the log's sequences; a new log's first id follows the clock in microseconds (docs/restore.md)")

	publish := func(topic string, payload any, opts ...replayd.PublishOption) (replayd.Event, error) {
		ev, err := hub.Publish(ctx, topic, payload, opts...)
		if err != nil {
			return ev, err
		}
		where := "topic " + topic
		if topic == "" {
			where = "broadcast"
		}
		fmt.Printf("  server → publish %-14s seq %-3d %-8s %s\n", where, ev.Sequence, ev.Type, ev.Payload)
		return ev, nil
	}

	// 1. Live.
	section(`1. A client opens the stream on topic "room-1" and receives live events`)
	c, err := dial(ctx, url, "")
	if err != nil {
		return err
	}
	if _, err := c.expect("hello"); err != nil {
		return err
	}
	for i, text := range []string{"hi", "how are you?", "fine, thanks"} {
		if _, err := publish("room-1", map[string]any{"n": i + 1, "text": text}); err != nil {
			return err
		}
		if _, err := c.expect("message"); err != nil {
			return err
		}
	}
	last := c.lastID
	c.close()
	fmt.Printf("  client disconnects; the last id it saw is %s\n", last)

	// 2. Offline.
	section("2. While the client is away, the server publishes")
	if _, err := publish("room-1", map[string]any{"n": 4, "text": "are you there?"}); err != nil {
		return err
	}
	if _, err := publish("room-1", map[string]any{"n": 5, "text": "hello?"}); err != nil {
		return err
	}
	other, err := publish("room-2", map[string]any{"text": "not for room-1"})
	if err != nil {
		return err
	}
	if _, err := publish("", map[string]any{"text": "deploy at noon"}, replayd.WithType("notice")); err != nil {
		return err
	}

	// 3. Resume.
	section("3. The client reconnects with Last-Event-ID: " + last)
	c, err = dial(ctx, url, last)
	if err != nil {
		return err
	}
	if _, err := c.expect("hello"); err != nil {
		return err
	}
	replayed, err := c.drain()
	if err != nil {
		return err
	}
	fmt.Printf("  replayed %d events: ids %s (id %d is on room-2, outside this client's scope)\n",
		len(replayed), ids(replayed), other.Sequence)
	fmt.Println("  ...and the stream is live again:")
	if _, err := publish("room-1", map[string]any{"n": 6, "text": "welcome back"}); err != nil {
		return err
	}
	if _, err := c.expect("message"); err != nil {
		return err
	}
	last = c.lastID
	c.close()
	fmt.Printf("  client disconnects; the last id it saw is %s\n", last)

	// 4. Gap.
	const burst = replayLimit + 3
	section(fmt.Sprintf("4. It misses %d events, more than the replay limit of %d, and reconnects", burst, replayLimit))
	for i := range burst {
		if _, err := publish("room-1", map[string]any{"n": 7 + i}); err != nil {
			return err
		}
	}
	fmt.Println("  client reconnects with Last-Event-ID:", last)
	c, err = dial(ctx, url, last)
	if err != nil {
		return err
	}
	defer c.close()
	if _, err := c.expect("hello"); err != nil {
		return err
	}
	gf, err := c.expect("gap")
	if err != nil {
		return err
	}
	var g struct {
		Reason        string `json:"reason"`
		MissedFrom    int64  `json:"missedFrom"`
		MissedThrough int64  `json:"missedThrough"`
		Missed        int64  `json:"missed"`
		ReplayLimit   int    `json:"replayLimit"`
	}
	if err := json.Unmarshal([]byte(gf.data), &g); err != nil {
		return fmt.Errorf("gap data: %w", err)
	}
	fmt.Printf("  the gap says: %d events (ids %d..%d) will not be replayed (reason %q);\n"+
		"  a real client re-syncs from a snapshot before applying what follows\n",
		g.Missed, g.MissedFrom, g.MissedThrough, g.Reason)
	replayed, err = c.drain()
	if err != nil {
		return err
	}
	fmt.Printf("  replayed the newest %d events: ids %s\n", len(replayed), ids(replayed))

	fmt.Println()
	fmt.Println("done")
	return nil
}

func section(title string) {
	fmt.Println()
	fmt.Println("== " + title)
}

func ids(fs []frame) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = f.id
	}
	return strings.Join(s, ", ")
}

// frame is one SSE frame as an EventSource would see it.
type frame struct {
	id, event, data string
	hasID           bool
}

// client is a tiny SSE reader: one goroutine parses the response body into
// frames, and the caller takes them with a bounded wait.
type client struct {
	frames chan frame
	errc   chan error // the reader's end: EOF, or why it stopped
	cancel context.CancelFunc
	body   io.ReadCloser
	lastID string // the id an EventSource would send on reconnect
}

func dial(ctx context.Context, url, lastEventID string) (*client, error) {
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	c := &client{
		frames: make(chan frame, 64),
		errc:   make(chan error, 1),
		cancel: cancel,
		body:   resp.Body,
		lastID: lastEventID,
	}
	go c.read(ctx)
	return c, nil
}

// read parses the stream: "field: value" lines, a blank line ends a frame,
// several data lines are joined by "\n", lines starting with ":" are
// comments.
func (c *client) read(ctx context.Context) {
	r := bufio.NewReader(c.body)
	var f frame
	var data []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			c.errc <- err
			return
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if f.hasID || f.event != "" || data != nil {
				f.data = strings.Join(data, "\n")
				select {
				case c.frames <- f:
				case <-ctx.Done():
					c.errc <- ctx.Err()
					return
				}
			}
			f, data = frame{}, nil
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			f.id, f.hasID = value, true
		case "event":
			f.event = value
		case "data":
			data = append(data, value)
		}
	}
}

// next returns the next frame, printing it, or an error after wait.
func (c *client) next(wait time.Duration) (frame, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case f := <-c.frames:
		if f.hasID {
			c.lastID = f.id
		}
		id := "-"
		if f.hasID {
			id = f.id
		}
		fmt.Printf("  client ← id %-3s %-9s %s\n", id, f.event, f.data)
		return f, nil
	case err := <-c.errc:
		return frame{}, fmt.Errorf("stream ended: %w", err)
	case <-t.C:
		return frame{}, errTimeout
	}
}

var errTimeout = errors.New("timed out waiting for a frame")

// expect returns the next frame, which must be of the given event type.
func (c *client) expect(event string) (frame, error) {
	f, err := c.next(frameWait)
	if err != nil {
		return f, fmt.Errorf("waiting for %q: %w", event, err)
	}
	if f.event != event {
		return f, fmt.Errorf("got a %q frame, want %q", f.event, event)
	}
	return f, nil
}

// drain returns the frames that arrive until the stream is quiet for
// quietWait. The server writes hello, gap and the whole replay in one
// flush, so after the hello the replay is already in flight.
func (c *client) drain() ([]frame, error) {
	var fs []frame
	for {
		f, err := c.next(quietWait)
		if errors.Is(err, errTimeout) {
			return fs, nil
		}
		if err != nil {
			return fs, err
		}
		fs = append(fs, f)
	}
}

// close drops the connection, as a browser tab going to sleep would.
func (c *client) close() {
	c.cancel()
	c.body.Close()
}
