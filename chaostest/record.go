package chaostest

// The records the oracle checks: the hubs that served, SSE connections
// with every frame, poll sessions with every answer, in-process
// subscribers. Run fills them from its own clients; a test that drives
// hubs some other way (in other OS processes, say) fills them from its own
// and hands them to Check.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Server is what the oracle knows of a hub that served connections and
// polls: the options that shape its answers. Records point at it.
type Server struct {
	// Name names the hub in traces and statistics; a record whose After
	// was on another hub resumed on another hub than the one it left.
	Name string
	// ReplayLimit is the effective SSEOptions.ReplayLimit: 100 for 0, 0
	// for a negative one.
	ReplayLimit int
	// Retry is SSEOptions.Retry: the retry field of every hello's block
	// (0: none).
	Retry time.Duration
	// Detached is SSEOptions.DetachConnections: an admitted stream is
	// delimited by the connection's end, not chunked.
	Detached bool
	// Denied reports whether Authorize refuses a scope (none: global);
	// nil refuses none.
	Denied func(topics []string) bool
	// OverloadRetry is SSEOptions.OverloadRetry when MaxConnections is
	// set, else 0: the overload answer's retry is in [1×, 2×] it.
	OverloadRetry time.Duration
	// Unavailable: the hub may answer 503 other than as the overload
	// answer (it is closing, its database is down).
	Unavailable bool
}

func (s *Server) denies(topics []string) bool { return s.Denied != nil && s.Denied(topics) }

// Conn is the record of one SSE connection: the request, the response
// and every frame received, in order. Fill the exported fields, Add every
// frame (ReadFrames parses a response body into them), and set Stop and
// End when it is over.
type Conn struct {
	Server *Server
	Topics []string // the scope; none: global
	Sent   string   // the cursor sent (Last-Event-ID or lastEventId), "" for none
	Status int      // the response's status; 0: none (dropped before it)
	// Chunked: the response was chunked (served through net/http, not
	// detached).
	Chunked bool
	// After is the client's earlier visit whose end gave it Sent (its last
	// id, its last answer's cursor), nil if none did: Check holds Sent to
	// that cursor, and counts a resume on another hub when After was on
	// another hub.
	After Visit
	// Known is the newest sequence known committed before the request
	// was sent (Ledger.Max then): the hello's head must be at least this.
	// 0 checks nothing.
	Known int64
	// Revoked says how the request's access was revoked
	// (replayd.WithRevocation): RevokedBefore, RevokedWhileServed, or ""
	// for not at all.
	Revoked string

	// For traces and statistics only.
	ID          int
	Client      string // which client
	Mode        string // how Sent was chosen: fresh, resume, stale, ...
	Via         string // header or query
	Behaviour   string // how the client read
	End         string // what ended it
	Start, Stop time.Duration

	hub         string        // Run's clients: "A" or "B"
	revokeAfter time.Duration // Run's clients: when RevokedWhileServed, how long after the request arrived
	frames      []frame
	heartbeats  int
}

// How a request's access was revoked (Conn.Revoked, Poll.Revoked). A
// request revoked before it was sent must get nothing of the log: an SSE
// stream that ends before its hello (200, no frame), a poll 403. One
// revoked at some moment while it is served may end anywhere, a poll may
// be refused (403) or answered; what it got is checked as any other.
const (
	RevokedBefore      = "before"
	RevokedWhileServed = "while served"
)

// Visit is a *Conn or a *PollSession: one visit of a client to a hub,
// which a later one may resume from (After).
type Visit interface {
	// end returns the hub visited and the cursor the visit left the client
	// at, "" if it gave none.
	end() (hub, cursor string)
}

func (c *Conn) end() (string, string) { return c.Server.Name, c.LastID("") }

func (s *PollSession) end() (string, string) {
	cursor := ""
	for _, p := range s.Polls {
		if p.OK() {
			cursor = strconv.FormatInt(p.ans.Cursor, 10)
		}
	}
	return s.Server.Name, cursor
}

// prevHub returns the hub of a visit, "" for none.
func prevHub(v Visit) string {
	if v == nil {
		return ""
	}
	hub, _ := v.end()
	return hub
}

// frame is one received frame, reduced to what the checker needs.
type frame struct {
	kind byte // 'r' retry, 'o' the overload answer, 'h' hello, 'g' gap, 'e' event, '?' anything else
	seq  int64
	hash uint64
	data string // retry, hello, gap and unexpected frames
}

// Frame is one SSE frame as a client received it.
type Frame struct {
	ID    string
	HasID bool   // an id field was present
	Event string // "" means "message", as in an EventSource
	Data  string
	Retry string
}

// ReadFrames parses an SSE response body into frames, sending each to
// out, until it ends; it returns what ended it (io.EOF for a clean end).
// Comments are skipped; a field replayd never writes is an error. It does
// not close out.
func ReadFrames(r io.Reader, out chan<- Frame) error {
	in := make(chan wiretest.Frame)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range in {
			out <- Frame(f)
		}
	}()
	err := wiretest.ReadFrames(r, in)
	close(in)
	<-done
	return err
}

// Add records a frame the connection received.
func (c *Conn) Add(f Frame) {
	switch {
	case f.Event == "heartbeat" && !f.HasID:
		c.heartbeats++
	case f.Event == "hello" && f.HasID:
		if f.Retry != "" { // sent in the hello's block
			c.frames = append(c.frames, frame{kind: 'r', data: f.Retry})
		}
		seq, _ := strconv.ParseInt(f.ID, 10, 64)
		c.frames = append(c.frames, frame{kind: 'h', seq: seq, data: f.ID + " " + f.Data})
	case f.Retry != "" && !f.HasID && f.Event == "" && f.Data == "":
		c.frames = append(c.frames, frame{kind: 'o', data: f.Retry}) // the overload answer
	case f.Event == "gap" && !f.HasID:
		c.frames = append(c.frames, frame{kind: 'g', data: f.Data})
	case f.HasID && f.Event != "":
		seq, err := strconv.ParseInt(f.ID, 10, 64)
		if err != nil {
			c.frames = append(c.frames, frame{kind: '?', data: fmt.Sprintf("%+v", f)})
			return
		}
		c.frames = append(c.frames, frame{kind: 'e', seq: seq, hash: frameHash(f.Event, f.Data)})
	default:
		c.frames = append(c.frames, frame{kind: '?', data: fmt.Sprintf("%+v", f)})
	}
}

// Overloaded reports whether the connection got the overload answer: a
// retry field and nothing else.
func (c *Conn) Overloaded() bool {
	return len(c.frames) == 1 && c.frames[0].kind == 'o'
}

// LastID returns the id an EventSource resumes from after c: the last id
// c received, or lastID if it received none.
func (c *Conn) LastID(lastID string) string {
	for _, f := range c.frames {
		if f.kind == 'h' || f.kind == 'e' {
			lastID = strconv.FormatInt(f.seq, 10)
		}
	}
	return lastID
}

// Reached reports whether the connection has accounted for every event up
// to fence: received an id at or above it, or a gap reaching it (with a
// replay limit of 0, a client that connects after the fence never receives
// it).
func (c *Conn) Reached(fence int64) bool {
	return slices.ContainsFunc(c.frames, func(f frame) bool { return f.passes(fence) })
}

func (f frame) passes(fence int64) bool {
	switch f.kind {
	case 'e', 'h':
		return f.seq >= fence
	case 'g':
		var g wiretest.Gap
		return json.Unmarshal([]byte(f.data), &g) == nil && g.MissedThrough != nil && *g.MissedThrough >= fence
	}
	return false
}

// PollSession is the record of a run of consecutive polls of one hub and
// scope by one client, each passing back the cursor of the answer before
// (after a failed poll, the same cursor again).
type PollSession struct {
	Server *Server
	Topics []string // the scope; none: global
	// Mode is how the first cursor was chosen; "invalid" marks a session
	// whose cursor is meant to be refused (400), "future" one above any
	// head. Others are for statistics.
	Mode string
	// After is the client's earlier visit whose end gave it the first
	// poll's cursor, nil if none did (see Conn.After).
	After Visit
	Polls []*Poll

	// For traces only.
	ID     int
	Client string
	End    string

	hub string // Run's clients: "A" or "B"
}

// Poll is the record of one poll request and its answer. Fill the request
// fields, then Record the response.
type Poll struct {
	Sent  string // the cursor sent, "" for none
	Limit int    // the limit sent
	Wait  time.Duration
	// Known is the newest sequence known committed before the request
	// was sent (Ledger.Max then): the answer's head must be at least
	// this. 0 checks nothing.
	Known int64
	// Revoked says how the request's access was revoked, as Conn.Revoked.
	Revoked string

	Status      int    // 0: no answer (the request failed)
	RetryAfter  string // the Retry-After header
	Start, Stop time.Duration

	err     string // a malformed answer
	ans     pollAnswer
	gap     *wiretest.Gap
	gapData string
}

type pollAnswer struct {
	Topics []string    `json:"topics"`
	Cursor int64       `json:"cursor"`
	Head   int64       `json:"head"`
	More   bool        `json:"more"`
	Events []pollEvent `json:"-"` // filled by parse
}

type pollEvent struct {
	seq   int64
	topic *string
	hash  uint64
}

// Record records the response: its status, its Retry-After header and its
// body (an answer when status is 200). It returns an error for a 200 whose
// body is not a well-formed answer, which Check reports too.
func (p *Poll) Record(status int, retryAfter string, body []byte) error {
	p.Status, p.RetryAfter = status, retryAfter
	switch {
	case status == 0 || status == 403 || status == 400 || status == 503:
		return nil
	case status != 200:
		p.err = fmt.Sprintf("status %d: %.200s", status, body)
		return nil
	}
	if err := p.parse(body); err != nil {
		p.err = err.Error()
		return err
	}
	return nil
}

// OK reports whether the poll was answered 200 with a well-formed answer.
func (p *Poll) OK() bool { return p.Status == 200 && p.err == "" }

// Cursor, Head, Events and Gap read an OK answer: its cursor, its head,
// how many events it carried, and its gap's reason ("" for none).
func (p *Poll) Cursor() int64 { return p.ans.Cursor }

// Head: see Cursor.
func (p *Poll) Head() int64 { return p.ans.Head }

// Events: see Cursor.
func (p *Poll) Events() int { return len(p.ans.Events) }

// Gap: see Cursor.
func (p *Poll) Gap() string {
	if p.gap == nil {
		return ""
	}
	return p.gap.Reason
}

// passes reports whether an answer accounts for every event up to fence.
func (p *Poll) passes(fence int64) bool {
	if !p.OK() {
		return false
	}
	if p.ans.Cursor >= fence {
		return true
	}
	return p.gap != nil && p.gap.MissedThrough != nil && *p.gap.MissedThrough >= fence
}

// parse reads an answer: all six keys, the gap's six keys, each event's
// four.
func (p *Poll) parse(body []byte) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil {
		return fmt.Errorf("answer %.200q: %v", body, err)
	}
	for _, k := range []string{"topics", "cursor", "head", "more", "gap", "events"} {
		if _, ok := keys[k]; !ok {
			return fmt.Errorf("answer lacks key %q: %.200s", k, body)
		}
	}
	if len(keys) != 6 {
		return fmt.Errorf("answer has %d keys, want 6: %.200s", len(keys), body)
	}
	if err := json.Unmarshal(body, &p.ans); err != nil {
		return err
	}
	if p.ans.Topics == nil {
		return fmt.Errorf("topics is %s, want a list", keys["topics"])
	}
	if g := string(keys["gap"]); g != "null" {
		parsed, err := wiretest.ParseGap(g)
		if err != nil {
			return err
		}
		p.gap, p.gapData = &parsed, g
	}
	var events []map[string]json.RawMessage
	if err := json.Unmarshal(keys["events"], &events); err != nil || events == nil {
		return fmt.Errorf("events %.200s: %v", keys["events"], err)
	}
	for _, ev := range events {
		var pe pollEvent
		var typ string
		if len(ev) != 4 || json.Unmarshal(ev["id"], &pe.seq) != nil || json.Unmarshal(ev["type"], &typ) != nil ||
			json.Unmarshal(ev["topic"], &pe.topic) != nil || ev["data"] == nil {
			return fmt.Errorf("event %v: want id, type, topic and data", ev)
		}
		pe.hash = frameHash(typ, string(ev["data"]))
		p.ans.Events = append(p.ans.Events, pe)
	}
	return nil
}

// Subscriber records what a hub's Subscribe delivers, for Check.
type Subscriber struct {
	Name  string
	start int64 // at or above the hub's live position when it subscribed
	mu    sync.Mutex
	seqs  []int64
	cond  chan struct{} // signalled on every delivery
}

// Subscribe subscribes a new Subscriber named name to h.
func Subscribe(name string, h *replayd.EventHub) (*Subscriber, error) {
	s := &Subscriber{Name: name, cond: make(chan struct{}, 1)}
	h.Subscribe(func(ev replayd.Event) {
		s.mu.Lock()
		s.seqs = append(s.seqs, ev.Sequence)
		s.mu.Unlock()
		select {
		case s.cond <- struct{}{}:
		default:
		}
	})
	// Subscribe delivers every event above the hub's live position, which
	// is never above the head: the head read now is a start to check from.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	start, err := h.LatestSequence(ctx)
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	s.start = start
	return s, nil
}

// Wait waits, for at most d, until s has seen through; it reports whether
// it did and the last sequence it saw.
func (s *Subscriber) Wait(through int64, d time.Duration) (bool, int64) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		s.mu.Lock()
		last := int64(0)
		if n := len(s.seqs); n > 0 {
			last = s.seqs[n-1]
		}
		s.mu.Unlock()
		if last >= through {
			return true, last
		}
		select {
		case <-s.cond:
		case <-timer.C:
			return false, last
		}
	}
}
