package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Transport names how a Client reads the stream.
type Transport string

const (
	// Auto reads the SSE endpoint and falls back to long polls, for the rest
	// of the Run, when three connection attempts in a row end without a
	// hello or none arrives within 10 s (a proxy that buffers or refuses
	// streams), as the browser module does. It needs both URLs.
	Auto Transport = "auto"
	// SSE reads the SSE endpoint only.
	SSE Transport = "sse"
	// Poll reads the poll endpoint only, in long polls.
	Poll Transport = "poll"
)

// FromHead, as Options.Cursor, starts at the log's head: only events
// published after the client first connects.
const FromHead int64 = -1

// Options configure a Client. Only a URL is required.
type Options struct {
	// SSE is the URL of the SSE endpoint (EventHub.Handler), Poll the URL
	// of the poll endpoint (EventHub.PollHandler). Their queries may carry
	// parameters of the application's; the client adds its own.
	SSE, Poll string
	// Transport chooses between them. "" means Auto when both URLs are
	// given, else the transport of the one given.
	Transport Transport
	// Topics is the scope: the events of these topics and the broadcasts.
	// Empty: the global scope, every event.
	Topics []string
	// TopicParam is the server's SSEOptions.TopicParam; default "topic".
	TopicParam string
	// GapType is the server's SSEOptions.GapEventType; default "gap".
	GapType string

	// Cursor is where the client starts: the id of the last event the
	// application has, so it gets every event after it. The zero value, 0,
	// starts at the beginning of the log: nothing retained is missed.
	// FromHead starts at the head instead (a fresh subscriber).
	Cursor int64

	// Header, if set, is called before every request (each connection
	// attempt and each poll) with the request's headers, to set a fresh
	// token, say. An error it returns ends Run with that error.
	Header func(ctx context.Context, h http.Header) error
	// HTTPClient sends the requests. nil: a client of the Client's own,
	// whose idle connections are closed when Run returns. Its Timeout must
	// be zero (a stream lasts as long as it lasts).
	HTTPClient *http.Client
	// Logger receives a line for every reconnect and its reason. nil:
	// nothing is logged.
	Logger *slog.Logger

	// MinBackoff and MaxBackoff bound the delay before a reconnect: after
	// n failed attempts in a row, a delay drawn at random (full jitter)
	// between 0 and MinBackoff×2ⁿ, at most MaxBackoff. A server's retry
	// field or Retry-After raises it. Defaults 500 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// IdleTimeout drops an SSE connection on which nothing at all (not
	// even a heartbeat) has arrived for about this long, and reconnects:
	// a connection that died without a word. The handler's own time does
	// not count. Default 45 s (three of the server's default heartbeat
	// intervals); negative: never.
	IdleTimeout time.Duration
	// PollWait is how long a long poll may be held; default 25 s.
	PollWait time.Duration
	// PollLimit is the most events asked for in one poll; 0: the server's
	// default.
	PollLimit int
}

// Client reads one scope of a replayd log. Create it with New and read with
// Run; Cursor may be called at any time from any goroutine.
type Client struct {
	opts      Options
	transport Transport
	http      *http.Client
	own       *http.Transport // the client's own transport, when HTTPClient is nil
	log       *slog.Logger

	cursor  atomic.Int64 // the last id handled; FromHead (-1) before the first hello
	running atomic.Bool  // a Run is under way
}

// New returns a Client for opts. It does not connect: Run does.
func New(opts Options) *Client {
	c := &Client{opts: opts, http: opts.HTTPClient, log: opts.Logger}
	o := &c.opts
	if o.TopicParam == "" {
		o.TopicParam = "topic"
	}
	if o.GapType == "" {
		o.GapType = "gap"
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 500 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	o.MaxBackoff = max(o.MaxBackoff, o.MinBackoff)
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 45 * time.Second
	}
	if o.PollWait <= 0 {
		o.PollWait = 25 * time.Second
	}
	c.transport = o.Transport
	if c.transport == "" {
		switch {
		case o.SSE != "" && o.Poll != "":
			c.transport = Auto
		case o.SSE != "":
			c.transport = SSE
		default:
			c.transport = Poll
		}
	}
	if c.http == nil {
		c.own = http.DefaultTransport.(*http.Transport).Clone()
		c.http = &http.Client{Transport: c.own}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.cursor.Store(max(o.Cursor, FromHead))
	return c
}

// Cursor returns the id of the last event the handler accepted (returned
// nil for), or where the stream moved to without an event: the head, when
// the client started FromHead and has received no event yet, the end of
// the range of a gap the handler accepted (MissedThrough), or the head
// of a log that did not know the cursor (after an unknown_cursor gap). It
// is FromHead until the first connection when the client started there.
// Persist it, and pass it back as Options.Cursor to continue where this
// client stopped, on either transport.
func (c *Client) Cursor() int64 { return c.cursor.Load() }

// Message is what Run hands the handler: an Event or a Gap, exactly one of
// them non-nil. Both, and what they hold, belong to the handler.
type Message struct {
	Event *Event
	Gap   *Gap
}

// Event is an event of the log.
type Event struct {
	ID   int64           // its sequence: strictly increasing along a Run
	Type string          // the type it was published with ("message" by default)
	Data json.RawMessage // the payload, as published
	// Topic is the event's topic, "" for a broadcast, when HasTopic: polls
	// carry it, SSE frames do not.
	Topic    string
	HasTopic bool
}

// Gap says that events of the scope were not delivered (they were pruned,
// or beyond the server's replay limit, or the log did not know the
// cursor): the application's state is incomplete, and should be reloaded
// from a snapshot before it applies the events that follow. Fields the
// server cannot give are nil. See PROTOCOL.md for each reason. The range
// is the part of the server's that the application was not told yet (see
// the package doc, The cursor): never at or below the cursor.
type Gap struct {
	// Reason is "replay_limit", "pruned", "unknown_cursor" or
	// "invalid_cursor".
	Reason        string `json:"reason"`
	ResumedFrom   *int64 `json:"resumedFrom"`   // the cursor the client resumed from
	MissedFrom    *int64 `json:"missedFrom"`    // the first sequence of the missed range
	MissedThrough *int64 `json:"missedThrough"` // its last sequence
	Missed        *int64 `json:"missed"`        // how many events of the scope it held, when known
	ReplayLimit   int    `json:"replayLimit"`   // the server's limit in effect
}

// StatusError is Run's error for an answer no retry can fix: 400, 401,
// 403, 404 and any other 4xx but 408 and 429. For 401 and 403, refresh
// the credentials the Header hook sets and Run again: the client goes on
// from its cursor. It is also Run's error for 204 No Content, on either
// transport: a server's way to tell clients to stop reconnecting, which an
// EventSource obeys too (replayd's server never sends it).
type StatusError struct {
	StatusCode int
	URL        string // the request's, without its query
	Body       string // the start of the answer's body
}

func (e *StatusError) Error() string {
	if e.StatusCode == http.StatusNoContent {
		return fmt.Sprintf("replayd client: GET %s: 204 No Content: the server asks clients to stop reconnecting", e.URL)
	}
	return fmt.Sprintf("replayd client: GET %s: %d %s: %s", e.URL, e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

// errNoProgress is why a poll answer is backed off from: it should have
// moved the cursor and did not.
var errNoProgress = errors.New("replayd client: the poll answer did not move the cursor")

// ErrFrameTooLarge is Run's error for an SSE frame or poll answer larger
// than the client accepts (maxFrame, maxPollBody): not a replayd server.
var ErrFrameTooLarge = errors.New("replayd client: frame too large")

const (
	maxFrame      = 4 << 20  // bytes of one SSE frame's fields; the server's payloads are at most 1 MiB
	maxPollBody   = 64 << 20 // bytes of one poll answer; the server's are bounded far below
	helloTimeout  = 10 * time.Second
	fallbackTries = 3 // SSE attempts in a row without a hello before Auto falls back
)

// attempt is how one connection or poll ended.
type attempt struct {
	session bool          // an SSE hello, or a poll answer, arrived: the server is serving us
	stalled bool          // a poll answer that did not move the cursor when it should have: backed off as a failure
	wait    time.Duration // the server's retry or Retry-After: the least delay before the next
	now     bool          // poll again at once (more is owed)
	noHello bool          // Auto: no hello in helloTimeout
	err     error         // why it ended, for the log; nil for a clean end
}

// errStop wraps an error that ends Run: the handler's, the Header hook's,
// a StatusError.
type errStop struct{ err error }

func (e errStop) Error() string { return e.err.Error() }

// Run connects and hands every message to handle, in order, on the
// calling goroutine: the next is not read until handle returns (a slow
// handler slows the stream; the server may then cut it, and the client
// resumes with a gap if events were lost meanwhile). It reconnects by
// itself, with backoff, after every end of a connection, and returns only
// when ctx ends (ctx.Err()), when handle returns an error (that error,
// with the cursor left before the message it refused), on a StatusError,
// or on an error of Options.Header. A Client runs one Run at a time; a
// later Run goes on from Cursor.
func (c *Client) Run(ctx context.Context, handle func(Message) error) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("replayd client: Run called while another Run is running")
	}
	defer c.running.Store(false)
	if c.own != nil {
		defer c.own.CloseIdleConnections()
	}
	transport := c.transport
	switch {
	case transport != SSE && transport != Poll && transport != Auto:
		return fmt.Errorf("replayd client: unknown transport %q", transport)
	case transport != Poll && c.opts.SSE == "":
		return fmt.Errorf("replayd client: transport %q needs Options.SSE", transport)
	case transport != SSE && c.opts.Poll == "":
		return fmt.Errorf("replayd client: transport %q needs Options.Poll", transport)
	}
	failures := 0 // attempts in a row that ended without a session
	var pollNow bool
	for {
		var a attempt
		if transport == Poll {
			a = c.poll(ctx, handle, pollNow)
		} else {
			a = c.stream(ctx, handle, transport == Auto)
		}
		var stop errStop
		if errors.As(a.err, &stop) {
			return stop.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		pollNow = a.now
		if a.session && !a.stalled {
			failures = 0
		} else {
			failures++
		}
		if transport == Auto && (a.noHello || failures >= fallbackTries) {
			c.log.Info("replayd client: falling back to long polls", "attempts", failures, "err", a.err)
			transport, failures = Poll, 0
			continue
		}
		if a.now {
			continue
		}
		if transport == Poll && a.session && a.err == nil && a.wait == 0 {
			continue // a poll answered: the next at once
		}
		d := max(c.backoff(failures), a.wait)
		c.log.Debug("replayd client: reconnecting", "transport", transport, "in", d, "failures", failures, "err", a.err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// backoff draws the delay after n failures in a row: full jitter over
// MinBackoff×2ⁿ, capped at MaxBackoff.
func (c *Client) backoff(n int) time.Duration {
	ceil := c.opts.MaxBackoff
	if n < 30 {
		ceil = min(ceil, c.opts.MinBackoff<<n)
	}
	return rand.N(ceil + 1)
}

// newRequest makes a GET of base with the scope's topics and params, and
// the Header hook's headers.
func (c *Client) newRequest(ctx context.Context, base string, params url.Values) (*http.Request, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, errStop{fmt.Errorf("replayd client: %w", err)}
	}
	q := u.Query()
	q.Del(c.opts.TopicParam)
	for _, t := range c.opts.Topics {
		q.Add(c.opts.TopicParam, t)
	}
	for k, vs := range params {
		q[k] = vs
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, errStop{fmt.Errorf("replayd client: %w", err)}
	}
	if c.opts.Header != nil {
		if err := c.opts.Header(ctx, req.Header); err != nil {
			return nil, errStop{err}
		}
	}
	return req, nil
}

// refused turns an answer other than 200 into an attempt: a StatusError to
// return for 204 and the statuses no retry can fix, else a failure to retry after
// Retry-After, if any.
func refused(resp *http.Response) attempt {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	err := &StatusError{StatusCode: resp.StatusCode, URL: bareURL(resp.Request.URL), Body: strings.TrimSpace(string(body))}
	code := resp.StatusCode
	if code == http.StatusNoContent || code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests {
		return attempt{err: errStop{err}}
	}
	return attempt{wait: retryAfter(resp.Header.Get("Retry-After")), err: err}
}

// bareURL is u without its query or credentials, which may hold a token:
// for errors and logs.
func bareURL(u *url.URL) string {
	v := *u
	v.RawQuery, v.User = "", nil
	return v.String()
}

// retryAfter parses a Retry-After header: delay seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(min(s, 3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), time.Hour)
	}
	return 0
}

// parseID parses an id as JavaScript's parseInt does a decimal: its
// leading digits. ok is false when it has none, or overflows.
func parseID(b []byte) (n int64, ok bool) {
	for i, ch := range b {
		if ch < '0' || ch > '9' {
			return n, i > 0
		}
		if n > (1<<63-1-int64(ch-'0'))/10 {
			return 0, false
		}
		n = n*10 + int64(ch-'0')
	}
	return n, len(b) > 0
}

// Gap reasons that start another history: the cursor moves to the head
// of the log being read, which may be below it.
const (
	reasonUnknownCursor = "unknown_cursor"
	reasonInvalidCursor = "invalid_cursor"
)

func isReset(g *Gap) bool {
	return g.Reason == reasonUnknownCursor || g.Reason == reasonInvalidCursor
}

// news trims a gap with a range (any reason but unknown_cursor and
// invalid_cursor) to what the application was not told yet: the part
// above cursor and, when top (the highest sequence the server has shown:
// its head, its last event) is known (>= 0), at or below top. It returns
// nil when nothing is left, and the cursor after the gap: past its range,
// never below cursor. A gap without a range is handed as it is, the cursor
// unchanged. A trimmed range no longer has a count.
func news(g *Gap, cursor, top int64) (_ *Gap, next int64) {
	if g.MissedThrough == nil {
		return g, cursor
	}
	through := *g.MissedThrough
	if top >= 0 && through > top {
		through = top
	}
	if through <= cursor || (g.MissedFrom != nil && *g.MissedFrom > through) {
		return nil, cursor
	}
	if through != *g.MissedThrough {
		g.MissedThrough, g.Missed = &through, nil
	}
	if g.MissedFrom != nil && *g.MissedFrom <= cursor {
		from := cursor + 1
		g.MissedFrom, g.Missed = &from, nil
	}
	return g, through
}

// accept hands m to handle and, when it accepts it, moves the cursor to
// next. A refusal is an errStop.
func (c *Client) accept(handle func(Message) error, m Message, next int64) error {
	if err := handle(m); err != nil {
		return errStop{err}
	}
	c.cursor.Store(next)
	return nil
}
