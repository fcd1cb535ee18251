package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/internal/sseparse"
)

var (
	errIdle    = errors.New("replayd client: stream idle for too long")
	errNoHello = errors.New("replayd client: no hello in time")
)

// stream makes one SSE connection and reads it until it ends.
func (c *Client) stream(ctx context.Context, handle func(Message) error, auto bool) (a attempt) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cursor := c.cursor.Load()
	req, err := c.newRequest(ctx, c.opts.SSE, nil)
	if err != nil {
		return attempt{err: err}
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-cache")
	if cursor >= 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(cursor, 10))
	}

	// The watchdogs: no hello within helloTimeout (Auto), nothing read for
	// IdleTimeout. Each cancels the request, with its reason.
	var helloTimer *time.Timer
	if auto {
		helloTimer = time.AfterFunc(helloTimeout, func() { cancel(errNoHello) })
		defer helloTimer.Stop()
	}
	body := &activityReader{}
	if d := c.opts.IdleTimeout; d > 0 {
		var last uint64
		var idle *time.Timer
		// Armed only once idle is set, which its function reads.
		idle = time.AfterFunc(time.Duration(math.MaxInt64), func() {
			if ctx.Err() != nil {
				return // the stream ended
			}
			n := body.reads.Load()
			if n == last && !body.busy.Load() {
				cancel(errIdle)
				return
			}
			last = n
			idle.Reset(d)
		})
		idle.Reset(d)
		defer func() {
			cancel(nil)
			idle.Stop()
		}()
	}
	// An end caused by a watchdog names it.
	defer func() {
		if cause := context.Cause(ctx); a.err != nil && (cause == errIdle || cause == errNoHello) {
			a.err, a.noHello = cause, cause == errNoHello
		}
	}()

	resp, err := c.http.Do(req)
	if err != nil {
		return attempt{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refused(resp)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return attempt{err: fmt.Errorf("replayd client: GET %s: Content-Type %q, not a stream", bareURL(req.URL), resp.Header.Get("Content-Type"))}
	}
	body.r = resp.Body
	return c.read(body, handle, helloTimer)
}

// read reads frames until the stream ends.
func (c *Client) read(body *activityReader, handle func(Message) error, helloTimer *time.Timer) (a attempt) {
	r := sseparse.NewReaderSize(body, 32<<10)
	r.MaxLine = maxFrame
	var size int // bytes of the current frame's fields
	r.Field = func(name, value []byte) error {
		if size += len(name) + len(value); size > maxFrame {
			return ErrFrameTooLarge
		}
		return nil
	}
	var (
		hello     bool  // the hello arrived
		resumed   int64 // the hello's cursor
		top       int64 // the hello's head, raised by the events since; -1: unknown
		handed    bool  // an event was handed since the hello
		lastType  string
		gapType   = []byte(c.opts.GapType)
		helloType = []byte("hello")
	)
	for {
		size = 0
		f, err := r.Next()
		if err != nil {
			if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, sseparse.ErrLineTooLong) {
				err = errStop{ErrFrameTooLarge}
			} else if err == io.EOF {
				err = nil // a clean end: the server closed the stream
			}
			a.err = err
			return a
		}
		if len(f.Retry) > 0 {
			if ms, ok := parseID(f.Retry); ok {
				a.wait = time.Duration(min(ms, 3_600_000)) * time.Millisecond
			}
		}
		switch {
		case !hello:
			// The first frame with an id is the hello; a lone retry (the
			// overload answer) or a comment comes before it or instead.
			if !f.HasID {
				continue
			}
			var d struct {
				Cursor *int64 `json:"cursor"`
				Head   *int64 `json:"head"`
			}
			if !bytes.Equal(f.Event, helloType) || json.Unmarshal(f.Data, &d) != nil || d.Cursor == nil {
				a.err = fmt.Errorf("replayd client: the stream did not start with a hello: %q", f.Event)
				return a
			}
			hello, a.session, resumed, top = true, true, *d.Cursor, -1
			if d.Head != nil {
				top = *d.Head
			}
			c.log.Debug("replayd client: stream open", "cursor", resumed, "hello", string(f.Data))
			if helloTimer != nil {
				helloTimer.Stop()
			}
			// A fresh client starts at the hello's cursor, the head. A
			// resuming one keeps its own: the hello repeats it, or names
			// the head when the log does not know it (a gap follows).
			if c.cursor.Load() < 0 {
				c.cursor.Store(resumed)
			}
		case !f.HasID:
			if bytes.Equal(f.Event, gapType) {
				g := new(Gap)
				if err := json.Unmarshal(f.Data, g); err != nil {
					a.err = fmt.Errorf("replayd client: gap %q: %w", f.Data, err)
					return a
				}
				// A gap with a range moves the cursor past it, and only
				// its part above the cursor is news. An unknown_cursor or
				// invalid_cursor gap right after the hello moves it to the
				// hello's cursor, the head of the log being read, which
				// may be above the client's cursor (one inside a range the
				// log skipped when it was opened) or below it (one above
				// the head); after an event it leaves the cursor there.
				cursor := c.cursor.Load()
				next := cursor
				if isReset(g) {
					if !handed {
						next = resumed
					}
				} else if g, next = news(g, cursor, top); g == nil {
					c.log.Debug("replayd client: a gap at or below the cursor dropped", "cursor", cursor, "gap", string(f.Data))
					continue
				}
				body.busy.Store(true)
				err := c.accept(handle, Message{Gap: g}, next)
				body.busy.Store(false)
				if err != nil {
					a.err = err
					return a
				}
			}
			// heartbeats, and frames replayd does not send, are skipped
		default:
			id, ok := parseID(f.ID)
			if ok && top >= 0 {
				top = max(top, id)
			}
			if !ok || id <= c.cursor.Load() {
				continue // at most once: this one was handed already
			}
			if string(f.Event) != lastType {
				lastType = string(f.Event)
			}
			typ := lastType
			if typ == "" {
				typ = "message"
			}
			ev := &Event{ID: id, Type: typ, Data: bytes.Clone(f.Data)}
			body.busy.Store(true)
			err := c.accept(handle, Message{Event: ev}, id)
			body.busy.Store(false)
			if err != nil {
				a.err = err
				return a
			}
			handed = true
		}
	}
}

// activityReader counts the reads of a response body, and knows when the
// handler runs, for the idle watchdog.
type activityReader struct {
	r     io.Reader
	reads atomic.Uint64
	busy  atomic.Bool
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	a.reads.Add(1)
	return n, err
}
