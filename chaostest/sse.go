package chaostest

// The SSE clients: connections over real HTTP that resume, drop, stall and
// storm, each recording every frame it received.

import (
	"context"
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

// clientResult is one SSE client's connections, in order.
type clientResult struct {
	conns        []*Conn
	reachedFence bool
}

// client connects, reads and drops in a loop until the chaos phase ends,
// then reconnects until one of its connections reaches the fence.
func (e *env) client(idx int, rng *rand.Rand) clientResult {
	var res clientResult
	lastID, lastVisit := "", Visit(nil)
	sticky := idx%5 == 0 // a few clients mostly stay connected
	// drawRevocation's own, so the other choices are a run's without.
	revRng := rand.New(rand.NewPCG(e.seed, uint64(3000+idx)))
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
		c := &Conn{ID: int(e.connSeq.Add(1)), Client: fmt.Sprintf("client %d", idx), hub: "A"}
		if rng.IntN(5) < 2 {
			c.hub = "B"
		}
		c.Server = e.server(c.hub)
		c.Topics = drawScope(rng)
		switch r := rng.IntN(20); {
		case finishing && lastID != "", r < 10 && lastID != "":
			c.Mode, c.Sent, c.After = "resume", lastID, lastVisit
		case r < 13:
			c.Mode = "fresh"
		case r < 17:
			c.Mode = "stale"
			c.Sent = strconv.FormatInt(e.ledger.Stale(rng), 10)
		case r < 18:
			c.Mode = "future"
			c.Sent = strconv.FormatInt(e.ledger.Max()+1_000_000+rng.Int64N(1000), 10)
		default:
			c.Mode = "invalid"
			c.Sent = []string{"abc", "-1", "1.5", "+3", "18446744073709551616", "9223372036854775808", "0x1f", "1e3", "٣"}[rng.IntN(9)]
		}
		if c.Mode == "fresh" && !finishing && rng.IntN(3) == 0 {
			if id := e.pollCursor(rng); id != "" { // one cursor for both transports
				c.Mode, c.Sent = "poll", id
			}
		}
		c.Via = "header"
		if rng.IntN(4) == 0 {
			c.Via = "query"
		}
		if !finishing {
			c.Revoked, c.revokeAfter = drawRevocation(revRng)
		}
		// How this connection reads and when it drops.
		var life time.Duration // 0: until the server ends it or the finish
		var closeAfter int     // close after this many frames; 0: never
		var pauseAfter int     // stop reading after this many frames...
		var pause time.Duration
		switch r := rng.IntN(10); {
		case sticky && r < 7:
			c.Behaviour = "stay"
		case r < 4:
			c.Behaviour = "timed"
			life = time.Duration(20+rng.IntN(1000)) * time.Millisecond
		case r < 6:
			c.Behaviour = "count"
			closeAfter = 1 + rng.IntN(150)
		case r < 9:
			c.Behaviour = "slow"
			pauseAfter = 1 + rng.IntN(20)
			pause = time.Duration(300+rng.IntN(2000)) * time.Millisecond
			life = pause + time.Duration(rng.IntN(1000))*time.Millisecond
		default:
			c.Behaviour = "stay"
		}
		if finishing {
			life, closeAfter, pauseAfter = 0, 0, 0
		}
		reached := e.run(c, life, closeAfter, pauseAfter, pause)
		res.conns = append(res.conns, c)
		for c.Overloaded() && !reached {
			// Refused by the overload answer: an EventSource comes back
			// after the retry it was told, with the same request (the
			// answer carried no id).
			if !e.overloadWait(c) {
				return res
			}
			prev := c
			c = &Conn{ID: int(e.connSeq.Add(1)), Client: prev.Client, hub: prev.hub, Server: prev.Server, Topics: prev.Topics,
				Mode: prev.Mode, Sent: prev.Sent, After: prev.After, Via: prev.Via, Behaviour: prev.Behaviour,
				Revoked: prev.Revoked, revokeAfter: prev.revokeAfter}
			select {
			case <-e.finish:
				life, closeAfter, pauseAfter = 0, 0, 0
			default:
			}
			reached = e.run(c, life, closeAfter, pauseAfter, pause)
			res.conns = append(res.conns, c)
			if !c.Overloaded() && c.Status == http.StatusOK {
				e.stats.servedAfterOverload.Add(1)
			}
		}
		// The next connection resumes from the last id this one received,
		// as an EventSource would.
		if id := c.LastID(lastID); id != lastID {
			lastID, lastVisit = id, c
		}
		e.polls.sseLast[idx].Store(lastID)
		if reached {
			res.reachedFence = true
			return res
		}
		if c.Status != http.StatusOK {
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

// overloadWait waits the retry the overload answer told c, as an
// EventSource would; false if the finish deadline came first.
func (e *env) overloadWait(c *Conn) bool {
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
func (e *env) run(c *Conn, life time.Duration, closeAfter, pauseAfter int, pause time.Duration) (reached bool) {
	c.Start, c.Known = e.timeline.Since(), e.ledger.Max()
	defer func() {
		c.Stop = e.timeline.Since()
		// Hub A's streams begin with "retry: 1000"; the overload answer's
		// retry is in [1x, 2x] OverloadRetry, and nothing follows it.
		if c.Overloaded() {
			c.End = "overload answer"
			e.stats.overloaded.Add(1)
		}
	}()
	q := scopeQuery(c.Topics)
	if c.Sent != "" && c.Via == "query" {
		q.Set("lastEventId", c.Sent)
	}
	if p := revokeParam(c.Revoked, c.revokeAfter); p != "" {
		q.Set("revoke", p)
		if c.Revoked == RevokedBefore {
			e.stats.revokedBefore.Add(1)
		} else {
			e.stats.revokedWhileServed.Add(1)
		}
	}
	u := e.url(c.hub, "/events", q)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		e.t.Errorf("conn %d: %v", c.ID, err)
		return false
	}
	if c.Sent != "" && c.Via == "header" {
		req.Header.Set("Last-Event-ID", c.Sent)
	}
	resp, err := e.httpc.Do(req)
	if err != nil {
		// The server closed the connection before any response: a stream
		// killed during its handshake (over its buffer cap, or by a
		// hub-level disconnect) has its write deadline set to now, so not
		// even the headers go out. An EventSource sees a network error and
		// reconnects; so does this client.
		c.End = "dropped before the response: " + err.Error()
		e.stats.dropped.Add(1)
		return false
	}
	c.Status = resp.StatusCode
	c.Chunked = slices.Contains(resp.TransferEncoding, "chunked")
	if resp.StatusCode == http.StatusForbidden && c.Server.denies(c.Topics) {
		resp.Body.Close()
		c.End = "refused by Authorize"
		e.stats.forbidden.Add(1)
		return false
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		c.End = "status " + resp.Status
		e.stats.badStatus.Add(1) // a violation unless Authorize denies the scope: Check reports it
		return false
	}

	frames := make(chan wiretest.Frame, 4)
	parsed := make(chan error, 1)
	go func() {
		parsed <- wiretest.ReadFrames(resp.Body, frames)
		close(frames)
	}()
	closeConn := func(why string) {
		c.End = why
		cancel()
		resp.Body.Close()
		for f := range frames { // frames already on the wire still count
			c.Add(Frame(f))
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
				c.End = fmt.Sprintf("server ended the stream (%v)", <-parsed)
				if c.Behaviour == "slow" {
					c.End = "server ended the stream of a slow reader"
				}
				return reached
			}
			got++
			c.Add(Frame(f))
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
			if c.Reached(e.fence.Load()) {
				closeConn("reached the fence")
				return true
			}
		case <-e.finishDeadline:
			closeConn("gave up waiting for the fence")
			return reached
		}
	}
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
func (e *env) stormer(rng *rand.Rand, stop <-chan struct{}) []*Conn {
	var conns []*Conn
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
			c := &Conn{ID: int(e.connSeq.Add(1)), Client: "the stormer", hub: "A", Mode: "stale", Sent: "0", Via: "header", Behaviour: "storm"}
			if rng.IntN(3) == 0 {
				c.hub = "B"
			}
			c.Server = e.server(c.hub)
			c.Topics = drawScope(rng)
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
