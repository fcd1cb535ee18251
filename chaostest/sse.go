package chaostest

// The SSE clients: connections over real HTTP that resume, drop, stall and
// storm, each recording every frame it received.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// sseConn is one SSE connection and every frame it received.
type sseConn struct {
	id, client  int
	hub         string   // "A" or "B"
	topics      []string // the scope; none: global
	mode        string   // fresh, resume, stale, future, invalid
	sent        string   // the cursor sent, "" for none
	via         string   // "header" or "query"
	behaviour   string
	status      int
	overloaded  bool // refused by hub A's MaxConnections: only a retry, then the end
	chunked     bool // the response was chunked: served through net/http, not detached
	frames      []frame
	heartbeats  int
	end         string
	start, stop time.Duration
}

// frame is one received frame, reduced to what the checker needs.
type frame struct {
	kind byte // 'r' retry, 'h' hello, 'g' gap, 'e' event, '?' anything else
	seq  int64
	hash uint64
	data string // hello, gap and unexpected frames
}

// clientResult is one SSE client's connections, in order.
type clientResult struct {
	conns        []*sseConn
	reachedFence bool
}

// client connects, reads and drops in a loop until the chaos phase ends,
// then reconnects until one of its connections reaches the fence.
func (e *env) client(idx int, rng *rand.Rand) clientResult {
	var res clientResult
	lastID := ""
	sticky := idx%5 == 0 // a few clients mostly stay connected
	for {
		finishing := false
		select {
		case <-e.finish:
			finishing = true
		default:
		}
		select {
		case <-e.finishDeadline:
			return res
		default:
		}
		c := &sseConn{id: int(e.connSeq.Add(1)), client: idx}
		c.hub = "A"
		if rng.IntN(5) < 2 {
			c.hub = "B"
		}
		c.topics = drawScope(rng)
		switch r := rng.IntN(20); {
		case finishing && lastID != "", r < 10 && lastID != "":
			c.mode, c.sent = "resume", lastID
		case r < 13:
			c.mode = "fresh"
		case r < 17:
			c.mode = "stale"
			c.sent = strconv.FormatInt(rng.Int64N(e.ledger.max()+1), 10)
		case r < 18:
			c.mode = "future"
			c.sent = strconv.FormatInt(e.ledger.max()+1_000_000+rng.Int64N(1000), 10)
		default:
			c.mode = "invalid"
			c.sent = []string{"abc", "-1", "1.5", "+3", "18446744073709551616", "9223372036854775808", "0x1f", "1e3", "٣"}[rng.IntN(9)]
		}
		if c.mode == "fresh" && !finishing && rng.IntN(3) == 0 {
			if id := e.pollCursor(rng); id != "" { // one cursor for both transports
				c.mode, c.sent = "poll", id
			}
		}
		c.via = "header"
		if rng.IntN(4) == 0 {
			c.via = "query"
		}
		// How this connection reads and when it drops.
		var life time.Duration // 0: until the server ends it or the finish
		var closeAfter int     // close after this many frames; 0: never
		var pauseAfter int     // stop reading after this many frames...
		var pause time.Duration
		switch r := rng.IntN(10); {
		case sticky && r < 7:
			c.behaviour = "stay"
		case r < 4:
			c.behaviour = "timed"
			life = time.Duration(20+rng.IntN(1000)) * time.Millisecond
		case r < 6:
			c.behaviour = "count"
			closeAfter = 1 + rng.IntN(150)
		case r < 9:
			c.behaviour = "slow"
			pauseAfter = 1 + rng.IntN(20)
			pause = time.Duration(300+rng.IntN(2000)) * time.Millisecond
			life = pause + time.Duration(rng.IntN(1000))*time.Millisecond
		default:
			c.behaviour = "stay"
		}
		if finishing {
			life, closeAfter, pauseAfter = 0, 0, 0
		}
		reached := e.run(c, life, closeAfter, pauseAfter, pause)
		res.conns = append(res.conns, c)
		for c.overloaded && !reached {
			// Refused by the overload answer: an EventSource comes back
			// after the retry it was told, with the same request (the
			// answer carried no id).
			if !e.overloadWait(c) {
				return res
			}
			prev := c
			c = &sseConn{id: int(e.connSeq.Add(1)), client: idx, hub: prev.hub, topics: prev.topics,
				mode: prev.mode, sent: prev.sent, via: prev.via, behaviour: prev.behaviour}
			select {
			case <-e.finish:
				life, closeAfter, pauseAfter = 0, 0, 0
			default:
			}
			reached = e.run(c, life, closeAfter, pauseAfter, pause)
			res.conns = append(res.conns, c)
			if !c.overloaded && c.status == http.StatusOK {
				e.stats.servedAfterOverload.Add(1)
			}
		}
		// The next connection resumes from the last id this one received,
		// as an EventSource would.
		lastID = lastIDAfter(c, lastID)
		e.polls.sseLast[idx].Store(lastID)
		if reached {
			res.reachedFence = true
			return res
		}
		if c.status != http.StatusOK {
			// Dropped before the response, or refused (a failure, reported
			// above): retry shortly.
			backoff := time.NewTimer(time.Duration(5+rng.IntN(20)) * time.Millisecond)
			select {
			case <-backoff.C:
			case <-e.finishDeadline:
				backoff.Stop()
			}
		}
	}
}

// lastIDAfter returns the id a client resumes from after c: the last id c
// received, or lastID if it received none.
func lastIDAfter(c *sseConn, lastID string) string {
	for _, f := range c.frames {
		if f.kind == 'h' || f.kind == 'e' {
			lastID = strconv.FormatInt(f.seq, 10)
		}
	}
	return lastID
}

// overloadWait waits the retry the overload answer told c, as an
// EventSource would; false if the finish deadline came first.
func (e *env) overloadWait(c *sseConn) bool {
	ms, _ := strconv.ParseInt(c.frames[0].data, 10, 64)
	wait := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer wait.Stop()
	select {
	case <-wait.C:
		return true
	case <-e.finishDeadline:
		return false
	}
}

// run makes one connection and reads it until it is done; it reports
// whether the connection reached the fence.
func (e *env) run(c *sseConn, life time.Duration, closeAfter, pauseAfter int, pause time.Duration) (reached bool) {
	c.start = time.Since(e.start)
	defer func() {
		c.stop = time.Since(e.start)
		// Hub A's streams begin with "retry: 1000"; the overload answer's
		// retry is in [1x, 2x] OverloadRetry, and nothing follows it.
		if c.hub == "A" && len(c.frames) == 1 && c.frames[0].kind == 'r' && c.frames[0].data != "1000" {
			c.overloaded = true
			c.end = "overload answer"
			e.stats.overloaded.Add(1)
		}
	}()
	q := scopeQuery(c.topics)
	if c.sent != "" && c.via == "query" {
		q.Set("lastEventId", c.sent)
	}
	u := e.url(c.hub, "/events", q)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		e.t.Errorf("conn %d: %v", c.id, err)
		return false
	}
	if c.sent != "" && c.via == "header" {
		req.Header.Set("Last-Event-ID", c.sent)
	}
	resp, err := e.httpc.Do(req)
	if err != nil {
		// The server closed the connection before any response: a stream
		// killed during its handshake (over its buffer cap, or by a
		// hub-level disconnect) has its write deadline set to now, so not
		// even the headers go out. An EventSource sees a network error and
		// reconnects; so does this client.
		c.end = "dropped before the response: " + err.Error()
		e.stats.dropped.Add(1)
		return false
	}
	c.status = resp.StatusCode
	c.chunked = slices.Contains(resp.TransferEncoding, "chunked")
	if resp.StatusCode == http.StatusForbidden && c.hub == "A" && e.deniedScope(c.topics) {
		resp.Body.Close()
		c.end = "refused by Authorize"
		e.stats.forbidden.Add(1)
		return false
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		c.end = "status " + resp.Status
		e.stats.badStatus.Add(1)
		e.t.Errorf("conn %d: GET %s: %s", c.id, u, resp.Status)
		return false
	}

	frames := make(chan wiretest.Frame, 4)
	parsed := make(chan error, 1)
	go func() {
		parsed <- wiretest.ReadFrames(resp.Body, frames)
		close(frames)
	}()
	closeConn := func(why string) {
		c.end = why
		cancel()
		resp.Body.Close()
		for f := range frames { // frames already on the wire still count
			c.add(f)
		}
	}

	var lifeC <-chan time.Time
	if life > 0 {
		lt := time.NewTimer(life)
		defer lt.Stop()
		lifeC = lt.C
	}
	finish := e.finish
	got := 0
	for {
		if pauseAfter > 0 && got >= pauseAfter && finish != nil {
			// A slow consumer: stop reading for a while.
			pauseAfter = 0
			pt := time.NewTimer(pause)
			select {
			case <-pt.C:
			case <-finish:
				pt.Stop()
			}
		}
		select {
		case f, ok := <-frames:
			if !ok {
				c.end = fmt.Sprintf("server ended the stream (%v)", <-parsed)
				if c.behaviour == "slow" {
					c.end = "server ended the stream of a slow reader"
				}
				return reached
			}
			got++
			c.add(f)
			if fence := e.fence.Load(); fence > 0 && len(c.frames) > 0 && c.frames[len(c.frames)-1].passes(fence) {
				reached = true
				closeConn("reached the fence")
				return reached
			}
			if closeAfter > 0 && got >= closeAfter {
				closeConn(fmt.Sprintf("client closed after %d frames", got))
				return reached
			}
		case <-lifeC:
			closeConn("client closed after its lifetime")
			return reached
		case <-finish:
			// Finishing: read on, without dropping, until the fence.
			finish, lifeC, closeAfter, pauseAfter = nil, nil, 0, 0
			if c.reached(e.fence.Load()) {
				closeConn("reached the fence")
				return true
			}
		case <-e.finishDeadline:
			closeConn("gave up waiting for the fence")
			return reached
		}
	}
}

// add records a frame.
func (c *sseConn) add(f wiretest.Frame) {
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
		c.frames = append(c.frames, frame{kind: 'r', data: f.Retry}) // the overload answer
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

// reached reports whether the connection has accounted for every event up
// to the fence: received an id at or above it, or a gap reaching it (with
// a replay limit of 0, a client that connects after the fence never
// receives it).
func (c *sseConn) reached(fence int64) bool {
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

// scopeQuery is the query of a request for scope.
func scopeQuery(scope []string) url.Values {
	q := url.Values{}
	for _, t := range scope {
		q.Add("topic", t)
	}
	return q
}

// url is the URL of path on hub ("A" or "B") with query q.
func (e *env) url(hub, path string, q url.Values) string {
	u := e.urlA + path
	if hub == "B" {
		u = e.urlB + path
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// drawScope draws a connection's scope: global a third of the time, else
// 1 to 4 distinct topics in random order.
func drawScope(rng *rand.Rand) []string {
	if rng.IntN(3) == 0 {
		return nil
	}
	var scope []string
	for _, i := range rng.Perm(len(allTopics))[:1+rng.IntN(4)] {
		scope = append(scope, allTopics[i])
	}
	return scope
}

// stormSize is how many connections one handshake storm opens at once.
const stormSize = 24

// stormer opens storms of connections resuming from cursor 0 (every event
// of the log above it to count, replay or name in a gap) on either hub,
// one after another with short pauses, until stop is closed and at least
// two storms ran. It returns the connections for the checker. Each reads
// for a short while and drops.
func (e *env) stormer(rng *rand.Rand, stop <-chan struct{}) []*sseConn {
	var conns []*sseConn
	for storm := 0; ; storm++ {
		if storm >= 2 {
			wait := time.NewTimer(time.Duration(10+rng.IntN(100)) * time.Millisecond)
			select {
			case <-stop:
				wait.Stop()
				return conns
			case <-wait.C:
			}
		}
		var wg sync.WaitGroup
		for range stormSize {
			c := &sseConn{id: int(e.connSeq.Add(1)), client: -1, hub: "A", mode: "stale", sent: "0", via: "header", behaviour: "storm"}
			if rng.IntN(3) == 0 {
				c.hub = "B"
			}
			c.topics = drawScope(rng)
			life := time.Duration(50+rng.IntN(400)) * time.Millisecond
			conns = append(conns, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				e.run(c, life, 0, 0, 0)
			}()
		}
		wg.Wait()
	}
}
