package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"github.com/replayd/replayd/client"
)

// tailLine is one line `replayd tail` prints: an event or a gap.
type tailLine struct {
	Sequence int64            `json:"sequence,omitempty"`
	Type     string           `json:"type,omitempty"`
	Topic    *json.RawMessage `json:"topic,omitempty"` // null: a broadcast; absent: not carried
	Data     json.RawMessage  `json:"data,omitempty"`
	Gap      *tailGap         `json:"gap,omitempty"`
}

// tailGap is a gap's line.
type tailGap struct {
	Reason  string `json:"reason"`
	From    *int64 `json:"from,omitempty"`
	Through *int64 `json:"through,omitempty"`
	Count   *int64 `json:"count,omitempty"`
}

// lineOf renders m as one line, newline included.
func lineOf(m client.Message) []byte {
	var l tailLine
	switch {
	case m.Event != nil:
		e := m.Event
		l.Sequence, l.Type, l.Data = e.ID, e.Type, e.Data
		if !json.Valid(l.Data) {
			l.Data, _ = json.Marshal(string(e.Data))
		}
		if e.HasTopic {
			t := json.RawMessage("null")
			if e.Topic != "" {
				t, _ = json.Marshal(e.Topic)
			}
			l.Topic = &t
		}
	case m.Gap != nil:
		g := m.Gap
		l.Gap = &tailGap{Reason: g.Reason, From: g.MissedFrom, Through: g.MissedThrough, Count: g.Missed}
	}
	b, _ := json.Marshal(l)
	return append(b, '\n')
}

// tailConfig is `replayd tail`'s command line.
type tailConfig struct {
	events, poll string
	transport    client.Transport
	topics       []string
	cursor       int64
	token        string
	state        string
}

// tailUsage heads `replayd tail --help`.
const tailUsage = `Usage: replayd tail URL [flags]

Prints the events of the replayd server at URL to stdout, one JSON object a
line (an event, or a gap naming what was missed), until SIGINT or SIGTERM.
It reconnects by itself, saying on stderr when it cannot connect and when
it is connected again; it exits 1 on a refusal no retry can fix (400, 401,
403, 404: the server's answer is printed), and 2 on a bad flag or state
file. See docs/server.md.

Flags:
`

// parseTail parses `replayd tail`'s command line; on --help it prints the
// usage to help and returns flag.ErrHelp.
func parseTail(args []string, help io.Writer) (tailConfig, error) {
	var c tailConfig
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	var topics multiFlag
	fs.Var(&topics, "topic", "a `topic` of the scope (repeatable; none: every event)")
	fs.Int64Var(&c.cursor, "cursor", 0, "start after this `sequence` when there is no state yet (0: the beginning; -1: the head)")
	transport := fs.String("transport", "auto", "`mode`: sse, poll, or auto (SSE, falling back to polls)")
	fs.StringVar(&c.token, "token", "", "a subscriber `token`, sent as a Bearer header")
	fs.StringVar(&c.state, "state", "", "a `file` keeping the cursor across runs")
	fs.StringVar(&c.events, "events", "", "the SSE endpoint's `URL` (default: URL/events)")
	fs.StringVar(&c.poll, "poll", "", "the poll endpoint's `URL` (default: URL/poll)")
	pos, err := parseFlags(fs, args, tailUsage, help)
	if err != nil {
		return c, err
	}
	c.topics = topics
	switch client.Transport(*transport) {
	case client.SSE, client.Poll, client.Auto:
		c.transport = client.Transport(*transport)
	default:
		return c, fmt.Errorf("--transport %q: want sse, poll or auto", *transport)
	}
	if c.cursor < -1 {
		return c, fmt.Errorf("--cursor %d: want a sequence, or -1 for the head", c.cursor)
	}
	if len(pos) > 1 {
		return c, fmt.Errorf("unexpected argument %q", pos[1])
	}
	if len(pos) == 1 {
		base, err := url.Parse(pos[0])
		if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
			return c, fmt.Errorf("URL %q: want http(s)://host[:port][/path]", pos[0])
		}
		b := strings.TrimSuffix(pos[0], "/")
		if c.events == "" {
			c.events = b + "/events"
		}
		if c.poll == "" {
			c.poll = b + "/poll"
		}
	}
	if c.events == "" && c.poll == "" {
		return c, errors.New("URL: missing (replayd tail URL [flags])")
	}
	if c.transport == client.SSE && c.events == "" {
		return c, errors.New("--transport sse: needs URL or --events")
	}
	if c.transport == client.Poll && c.poll == "" {
		return c, errors.New("--transport poll: needs URL or --poll")
	}
	if c.transport == client.Auto && (c.events == "" || c.poll == "") {
		return c, errors.New("--transport auto: needs URL, or both --events and --poll")
	}
	return c, nil
}

// tail runs `replayd tail`: every line written to stdout, then its
// sequence saved in the state file, until SIGINT or SIGTERM.
func tail(args []string, stdout, stderr io.Writer) int {
	c, err := parseTail(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "replayd tail: %v\n", err)
		return 2
	}
	cursor, partial := c.cursor, false
	if c.state != "" {
		s, ok, err := loadState(c.state)
		var bad *badStateError
		if errors.As(err, &bad) {
			fmt.Fprintf(stderr, "replayd tail: --state: %v\n", err)
			return 2
		}
		if err != nil {
			fmt.Fprintf(stderr, "replayd tail: --state: %v\n", err)
			return 1
		}
		if ok {
			cursor, partial = s.Cursor, s.Partial
		}
	}
	if partial {
		// The last run may have been killed in the middle of a line: end
		// what it left of it, so that a fragment is a line of its own,
		// which does not parse (a blank line if nothing was left), and
		// not glued to the line printed next.
		if _, err := stdout.Write([]byte{'\n'}); err != nil {
			fmt.Fprintf(stderr, "replayd tail: stdout: %v\n", err)
			return 1
		}
	}
	opts := client.Options{Transport: c.transport, Topics: c.topics, Cursor: cursor}
	if c.transport != client.Poll {
		opts.SSE = c.events
	}
	if c.transport != client.SSE {
		opts.Poll = c.poll
	}
	if c.token != "" {
		opts.Header = func(_ context.Context, h http.Header) error {
			h.Set("Authorization", "Bearer "+c.token)
			return nil
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rt := &connReporter{base: http.DefaultTransport.(*http.Transport).Clone(), ctx: ctx, w: stderr}
	defer rt.base.CloseIdleConnections()
	opts.HTTPClient = &http.Client{Transport: rt}
	cl := client.New(opts)
	atomic := atomicWrite(stdout)
	marked := false // the state says Partial: a line of this run may be torn
	save := func(n int64) error {
		if c.state == "" || n < 0 {
			return nil
		}
		return saveState(c.state, tailState{Cursor: n, Partial: marked})
	}
	err = cl.Run(ctx, func(m client.Message) error {
		line := lineOf(m)
		if c.state != "" && !marked && len(line) > atomic {
			// A kill could tear this line: say so first, once a run.
			before := cl.Cursor() // where the state is: before this message
			switch {
			case before >= 0:
			case m.Event != nil:
				before = m.Event.ID - 1
			case m.Gap.MissedFrom != nil:
				before = *m.Gap.MissedFrom - 1
			}
			marked = true
			if err := save(max(before, 0)); err != nil {
				return fmt.Errorf("--state: %w", err)
			}
		}
		// stdout is not buffered: the line is out of the process when
		// Write returns, before the state says so.
		if _, err := stdout.Write(line); err != nil {
			return fmt.Errorf("stdout: %w", err)
		}
		switch {
		case m.Event != nil:
			return save(m.Event.ID)
		case m.Gap != nil && m.Gap.MissedThrough != nil && (m.Gap.Reason == "replay_limit" || m.Gap.Reason == "pruned"):
			// The events after the missed range follow: a restart goes on
			// there, not to the same gap again.
			return save(*m.Gap.MissedThrough)
		}
		return nil // an unknown_cursor gap: the next event, or the exit, saves the cursor it moved
	})
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		marked = false // every line written is whole
		if err := save(cl.Cursor()); err != nil {
			fmt.Fprintf(stderr, "replayd tail: --state: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "replayd tail: %v\n", err)
	return 1
}

// atomicWrite is the longest line a kill cannot tear on w: a pipe takes a
// write of up to PIPE_BUF bytes whole or not at all (4096 on Linux, at
// least 512 by POSIX). On anything else (a file, a socket, a terminal), a
// write may be cut short by a kill, so every line may tear.
func atomicWrite(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		return 0
	}
	if runtime.GOOS == "linux" {
		return 4096
	}
	return 512
}

// connReporter says on stderr when tail cannot reach the server, and when
// it is connected again: once a change, not once a retry (the client
// retries a failed connection, a 5xx, 408 and 429 with backoff). A refusal
// no retry can fix (another 4xx) ends the run, and tail exits 1 naming it.
type connReporter struct {
	base *http.Transport
	ctx  context.Context // done: the failures are tail's own ending
	w    io.Writer

	mu      sync.Mutex // guards failing
	failing string     // the failure last reported; "" while connected
}

func (r *connReporter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.base.RoundTrip(req)
	if r.ctx.Err() != nil {
		return resp, err
	}
	u := *req.URL
	u.RawQuery, u.User = "", nil // a query may hold a token
	switch {
	case err != nil:
		r.report(fmt.Sprintf("cannot connect to %s: %v; retrying", u.String(), err))
	case resp.StatusCode == http.StatusOK:
		r.report("")
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests:
		r.report(fmt.Sprintf("cannot connect to %s: %s; retrying", u.String(), resp.Status))
	}
	return resp, err
}

// report prints failing ("" for connected) if it is news.
func (r *connReporter) report(failing string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if failing == r.failing {
		return
	}
	if failing == "" {
		fmt.Fprintln(r.w, "replayd tail: connected")
	} else {
		fmt.Fprintln(r.w, "replayd tail:", failing)
	}
	r.failing = failing
}
