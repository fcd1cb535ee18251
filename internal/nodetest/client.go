package nodetest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/replayd/replayd/chaostest"
)

// Mode is how a Client reads: SSE, polls, or SSE and polls by
// turns, one transport per node it visits, on one cursor.
type Mode string

const (
	OverSSE  Mode = "sse"
	OverPoll Mode = "poll"
	OverBoth Mode = "both"
)

// Client is a client hopping between nodes, over SSE, polls or both,
// recording every connection and poll for the oracle.
type Client struct {
	Name     string
	Scope    []string
	Mode     Mode
	Node     int  // the node it is on, or tries next
	FromZero bool // first connection sends Last-Event-ID 0
	Sticky   bool // leaves its node only when the stream ends
	Outages  bool // the store may be down: a 503 sends it to another node

	mu        sync.Mutex
	connected bool            // it holds a cursor: a hello, an event or an answer gave it
	cursor    int64           // as an EventSource keeps it: the last id received
	last      chaostest.Visit // the visit that gave it its cursor
	conns     []*chaostest.Conn
	sessions  []*chaostest.PollSession

	resumes     int // visits after the first (always on another node)
	killed      int // resumes after a visit the client did not end
	onRestarted int // visits to a node's second generation or later
	probes      int // unknown_cursor probes answered
	switches    int // visits whose transport differed from the previous visit's
}

// Stats is what a Client counted of its visits.
type Stats struct {
	Resumes     int // visits after the first (always on another node)
	Killed      int // resumes after a visit the client did not end
	OnRestarted int // visits to a node's second generation or later
	Probes      int // unknown_cursor probes answered
	Switches    int // visits whose transport differed from the previous visit's
}

// Stats returns the client's counts so far.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Resumes: c.resumes, Killed: c.killed, OnRestarted: c.onRestarted, Probes: c.probes, Switches: c.switches}
}

// CursorNow returns the cursor the client holds: the newest id it received.
func (c *Client) CursorNow() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cursor
}

// Run connects, reads, and hops to another node until ctx ends: a
// non-sticky client leaves after a random 300-1200 ms; any client leaves
// when its stream ends (its node was killed).
func (c *Client) Run(ctx context.Context, cl *Cluster, tr *Truth, rng *rand.Rand) {
	lostStream := false
	for visit := 0; ctx.Err() == nil; {
		base, gen, srv := cl.Addr(c.Node)
		if base == "" {
			c.Node = (c.Node + 1) % 3
			SleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		life := time.Hour
		if !c.Sticky {
			life = time.Duration(300+rng.IntN(900)) * time.Millisecond
		}
		var (
			ours bool
			err  error
		)
		if c.Mode == OverPoll || (c.Mode == OverBoth && visit%2 == 1) {
			ours, err = c.pollFor(ctx, srv, base, gen, life, lostStream, tr, rng)
		} else {
			ours, err = c.connect(ctx, srv, base, gen, life, lostStream, tr)
		}
		if c.Mode == OverBoth && visit > 0 {
			c.mu.Lock()
			c.switches++
			c.mu.Unlock()
		}
		visit++
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			tr.Fail("%s on node %d: %v", c.Name, c.Node, err)
			return
		}
		lostStream = !ours
		c.Node = (c.Node + 1 + rng.IntN(2)) % 3 // another node
	}
}

// visit counts a visit that was answered: a resume (after a stream the
// client did not end, or not) and a visit to a node's second generation.
func (c *Client) visit(resuming, afterLoss bool, gen int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if resuming {
		c.resumes++
		if afterLoss {
			c.killed++
		}
	}
	if gen >= 2 {
		c.onRestarted++
	}
}

// connect runs one SSE connection for at most life, recording it; it
// returns whether the client ended it (false: the server or the network
// did). err is for what ends the client.
func (c *Client) connect(ctx context.Context, srv *chaostest.Server, base string, gen int, life time.Duration, afterLoss bool, tr *Truth) (ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	c.mu.Lock()
	resuming := c.connected
	rec := &chaostest.Conn{Server: srv, Topics: c.Scope, ID: int(tr.ids.Add(1)), Client: c.Name, Mode: "fresh", Via: "header",
		Behaviour: map[bool]string{false: "hop", true: "sticky"}[c.Sticky], Start: tr.Timeline.Since(), Known: tr.Ledger.Max()}
	switch {
	case resuming:
		rec.Mode, rec.Sent, rec.After = "resume", strconv.FormatInt(c.cursor, 10), c.last
	case c.FromZero:
		rec.Mode, rec.Sent = "zero", "0"
	}
	c.conns = append(c.conns, rec)
	c.mu.Unlock()
	defer func() { rec.Stop = tr.Timeline.Since() }()

	req, err := http.NewRequestWithContext(cctx, http.MethodGet, base+"/?"+url.Values{"topic": c.Scope}.Encode(), nil)
	if err != nil {
		return false, err
	}
	if rec.Sent != "" {
		req.Header.Set("Last-Event-ID", rec.Sent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		rec.End = "no response: " + err.Error()
		return cctx.Err() != nil, nil // refused (the node is dying): try another
	}
	defer resp.Body.Close()
	rec.Status, rec.Chunked = resp.StatusCode, slices.Contains(resp.TransferEncoding, "chunked")
	if resp.StatusCode != http.StatusOK {
		rec.End = "status " + resp.Status
		if c.Outages && resp.StatusCode == http.StatusServiceUnavailable {
			return false, nil
		}
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	c.visit(resuming, afterLoss, gen)

	frames := make(chan chaostest.Frame, 64)
	perr := make(chan error, 1)
	go func() {
		perr <- chaostest.ReadFrames(resp.Body, frames)
		close(frames)
	}()
	for f := range frames {
		rec.Add(f)
		if seq, err := strconv.ParseInt(f.ID, 10, 64); f.HasID && err == nil {
			c.mu.Lock()
			c.connected, c.cursor, c.last = true, seq, rec
			c.mu.Unlock()
		}
	}
	rec.End = fmt.Sprintf("stream ended (%v)", <-perr)
	if cctx.Err() != nil {
		rec.End = "client left"
	}
	return cctx.Err() != nil, nil
}

// pollFor polls one node for at most life, passing the cursor back each
// time, as one recorded session; it returns whether the client ended the
// visit (false: a request failed, the node is down). err is for what ends
// the client.
func (c *Client) pollFor(ctx context.Context, srv *chaostest.Server, base string, gen int, life time.Duration, afterLoss bool, tr *Truth, rng *rand.Rand) (ours bool, err error) {
	end := time.Now().Add(life)
	if rng.IntN(4) == 0 {
		if !c.probe(ctx, srv, base, tr) {
			return ctx.Err() != nil, nil
		}
	}
	c.mu.Lock()
	resuming := c.connected
	s := &chaostest.PollSession{Server: srv, Topics: c.Scope, ID: int(tr.ids.Add(1)), Client: c.Name, Mode: "fresh"}
	switch {
	case resuming:
		s.Mode, s.After = "resume", c.last
	case c.FromZero:
		s.Mode = "zero"
	}
	c.sessions = append(c.sessions, s)
	c.mu.Unlock()
	first, idle := true, false
	for time.Now().Before(end) {
		if ctx.Err() != nil {
			s.End = "client stopped"
			return true, nil
		}
		c.mu.Lock()
		connected, cursor := c.connected, c.cursor
		c.mu.Unlock()
		p := &chaostest.Poll{Limit: 1 + rng.IntN(200), Known: tr.Ledger.Max()}
		q := url.Values{"topic": c.Scope}
		if connected || c.FromZero {
			p.Sent = strconv.FormatInt(cursor, 10)
			q.Set("cursor", p.Sent)
			if idle || rng.IntN(2) == 0 {
				p.Wait = 500 * time.Millisecond // held until an event of the scope is committed on any node
				q.Set("wait", "0.5")
			}
		}
		q.Set("limit", strconv.Itoa(p.Limit))
		s.Polls = append(s.Polls, p)
		status, ok, err := getPoll(ctx, base+"/poll?"+q.Encode(), p, tr)
		if err != nil {
			s.End = err.Error()
			return ctx.Err() != nil, nil // the node is dying: try another
		}
		if !ok {
			s.End = fmt.Sprintf("status %d", status)
			if c.Outages && status == http.StatusServiceUnavailable {
				return false, nil // its database is down: try another node
			}
			return false, fmt.Errorf("poll on %s: %s", base, s.End)
		}
		if first {
			first = false
			c.visit(resuming, afterLoss, gen)
		}
		c.mu.Lock()
		c.connected, c.cursor, c.last = true, p.Cursor(), s
		c.mu.Unlock()
		idle = p.Events() == 0 && p.Gap() == ""
	}
	s.End = "visit over"
	return true, nil
}

// probe sends one poll with a cursor far above any head, as a session of
// its own: the poll transport answers an unknown_cursor gap with the head as the
// cursor and no events. The client's cursor does not move. It returns
// false when the request failed (the node is dying).
func (c *Client) probe(ctx context.Context, srv *chaostest.Server, base string, tr *Truth) bool {
	known := tr.Ledger.Max()
	p := &chaostest.Poll{Sent: strconv.FormatInt(known+1e12, 10), Limit: 50, Known: known}
	s := &chaostest.PollSession{Server: srv, Topics: c.Scope, ID: int(tr.ids.Add(1)), Client: c.Name, Mode: "future", End: "probe", Polls: []*chaostest.Poll{p}}
	c.mu.Lock()
	c.sessions = append(c.sessions, s)
	c.mu.Unlock()
	q := url.Values{"topic": c.Scope, "cursor": {p.Sent}, "limit": {strconv.Itoa(p.Limit)}}
	if _, ok, err := getPoll(ctx, base+"/poll?"+q.Encode(), p, tr); err != nil || !ok {
		return false
	}
	c.mu.Lock()
	c.probes++
	c.mu.Unlock()
	return true
}

// getPoll sends one poll, for at most 10 s, and records it in p. ok
// reports a well-formed 200 answer; err a request that failed or a body
// cut short (the node was killed), which leaves p without a status.
func getPoll(ctx context.Context, u string, p *chaostest.Poll, tr *Truth) (status int, ok bool, err error) {
	p.Start = tr.Timeline.Since()
	defer func() { p.Stop = tr.Timeline.Since() }()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false, err
	}
	p.Record(resp.StatusCode, resp.Header.Get("Retry-After"), body)
	return resp.StatusCode, p.OK(), nil
}
