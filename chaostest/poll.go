package chaostest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Poll clients (the poll transport): next to the SSE clients, clients that poll
// either hub in sessions of consecutive polls, each passing back the cursor
// of the answer before, with varied limits, waits (0 and long polls) and
// scopes, from fresh, resumed, stale, future and invalid cursors, and from
// an SSE client's last id; SSE connections in turn sometimes resume from a
// poll client's cursor (mode "poll"): one cursor for both transports. Every
// answer is checked against the ledger (check_poll.go) by the rules
// checkConn applies to a stream: ids strictly increasing from the cursor
// sent, every event a published one of the scope with its type and data,
// every visible event above the cursor returned or inside the answer's gap,
// nothing outside the granted scope.

const numPollClients = 8

// pollState is the poll clients' share of a chaos run.
type pollState struct {
	sseLast  [numClients]atomic.Value     // each SSE client's last id (string)
	pollLast [numPollClients]atomic.Value // each poll client's last cursor (string)

	mu       sync.Mutex
	sessions [][]*PollSession // by poll client
	reached  []bool

	polls, answers, longPolls, events, fromSSE           atomic.Int64
	overloaded, forbidden, closedB, dropped, badRequests atomic.Int64
	revokedBefore, revokedWhileServed, revokedRefused    atomic.Int64
}

// startPollClients starts the poll clients on wg; their results are in
// e.polls once wg is done.
func (e *env) startPollClients(seed uint64, wg *sync.WaitGroup) {
	e.polls.sessions = make([][]*PollSession, numPollClients)
	e.polls.reached = make([]bool, numPollClients)
	for c := range numPollClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sessions, reached := e.pollClient(c, rand.New(rand.NewPCG(seed, uint64(2000+c))))
			e.polls.mu.Lock()
			e.polls.sessions[c], e.polls.reached[c] = sessions, reached
			e.polls.mu.Unlock()
		}()
	}
}

// pollClient polls in sessions until the chaos phase ends, then until one
// of its answers reaches the fence.
func (e *env) pollClient(idx int, rng *rand.Rand) (sessions []*PollSession, reached bool) {
	lastID, lastVisit := "", Visit(nil)
	// drawRevocation's own, so the other choices are a run's without.
	revRng := rand.New(rand.NewPCG(e.seed, uint64(4000+idx)))
	for {
		select {
		case <-e.finishDeadline:
			return sessions, false
		default:
		}
		s := &PollSession{ID: int(e.connSeq.Add(1)), Client: fmt.Sprintf("poll client %d", idx), hub: "A", Topics: drawScope(rng)}
		if rng.IntN(5) < 2 {
			s.hub = "B"
		}
		s.Server = e.server(s.hub)
		cursor := ""
		switch r := rng.IntN(20); {
		case r < 8 && lastID != "":
			s.Mode, cursor, s.After = "resume", lastID, lastVisit
		case r < 12:
			// An SSE client's last id: the two transports share a cursor.
			if id, _ := e.polls.sseLast[rng.IntN(numClients)].Load().(string); id != "" {
				s.Mode, cursor = "sse", id
				e.polls.fromSSE.Add(1)
			} else {
				s.Mode = "fresh"
			}
		case r < 15:
			s.Mode = "fresh"
		case r < 18:
			s.Mode, cursor = "stale", strconv.FormatInt(e.ledger.Stale(rng), 10)
		case r < 19:
			s.Mode, cursor = "future", strconv.FormatInt(e.ledger.Max()+1_000_000+rng.Int64N(1000), 10)
		default:
			s.Mode, cursor = "invalid", []string{"abc", "-1", "1.5", "18446744073709551616", "0x1f", " 7"}[rng.IntN(6)]
		}
		if finishing(e.finish) && lastID != "" {
			s.Mode, cursor, s.After = "resume", lastID, lastVisit
		}
		sessions = append(sessions, s)
		n := 1 + rng.IntN(20)
		for k := 0; ; k++ {
			fin := finishing(e.finish)
			if k >= n && !fin {
				s.End = fmt.Sprintf("session of %d polls done", k)
				break
			}
			select {
			case <-e.finishDeadline:
				s.End = "gave up waiting for the fence"
				return sessions, false
			default:
			}
			limit := []int{1, 2, 3, 10, 50, 100, 1000, 5000}[rng.IntN(8)]
			var wait time.Duration
			if fin || rng.IntN(2) == 0 {
				wait = time.Duration(50+rng.IntN(1500)) * time.Millisecond
			}
			var revoked string
			var revokeAfter time.Duration
			if !fin {
				revoked, revokeAfter = drawRevocation(revRng)
			}
			p := e.pollOnce(s, cursor, limit, wait, revoked, revokeAfter)
			s.Polls = append(s.Polls, p)
			if s.Mode == "invalid" {
				s.End = "invalid cursor"
				break
			}
			if p.Status == http.StatusForbidden && p.Revoked != "" && !s.Server.denies(s.Topics) {
				// Its access was revoked: the client signs in again and
				// polls again from the same cursor.
				e.polls.revokedRefused.Add(1)
				continue
			}
			if p.Status == http.StatusForbidden {
				s.End = "refused by Authorize"
				break
			}
			if p.Status != http.StatusOK {
				// Overloaded, a hub B closing under a restart, a dropped
				// connection: the same poll again shortly.
				time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
				continue
			}
			if !p.OK() {
				s.End = "malformed answer"
				break
			}
			cursor = strconv.FormatInt(p.ans.Cursor, 10)
			if lastID != cursor {
				lastID, lastVisit = cursor, s
			}
			e.polls.pollLast[idx].Store(cursor)
			if fence := e.fence.Load(); fence > 0 && p.passes(fence) {
				s.End = "reached the fence"
				return sessions, true
			}
			if wait == 0 && rng.IntN(2) == 0 {
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // pacing, not synchronisation
			}
		}
	}
}

// pollCursor returns a random poll client's last cursor, "" if it has none
// yet: an SSE connection resumes from it (mode "poll").
func (e *env) pollCursor(rng *rand.Rand) string {
	id, _ := e.polls.pollLast[rng.IntN(numPollClients)].Load().(string)
	return id
}

func finishing(finish <-chan struct{}) bool {
	select {
	case <-finish:
		return true
	default:
		return false
	}
}

// pollOnce makes one poll request and records its answer; its access is
// revoked as revoked and revokeAfter say (drawRevocation).
func (e *env) pollOnce(s *PollSession, cursor string, limit int, wait time.Duration, revoked string, revokeAfter time.Duration) *Poll {
	p := &Poll{Sent: cursor, Limit: limit, Wait: wait, Known: e.ledger.Max(), Start: e.timeline.Since(), Revoked: revoked}
	defer func() { p.Stop = e.timeline.Since() }()
	e.polls.polls.Add(1)
	if wait > 0 {
		e.polls.longPolls.Add(1)
	}
	q := scopeQuery(s.Topics)
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	q.Set("limit", strconv.Itoa(limit))
	if wait > 0 {
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))
	}
	if rp := revokeParam(revoked, revokeAfter); rp != "" {
		q.Set("revoke", rp)
		if revoked == RevokedBefore {
			e.polls.revokedBefore.Add(1)
		} else {
			e.polls.revokedWhileServed.Add(1)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait+waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url(s.hub, "/poll", q), nil)
	if err != nil {
		e.t.Errorf("poll: %v", err)
		return p
	}
	resp, err := e.pollc.Do(req)
	if err != nil {
		e.polls.dropped.Add(1)
		return p // status 0: retried
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		e.polls.dropped.Add(1)
		return p // status 0: retried
	}
	p.Record(resp.StatusCode, resp.Header.Get("Retry-After"), body)
	switch p.Status {
	case http.StatusOK:
		if p.OK() {
			e.polls.answers.Add(1)
			e.polls.events.Add(int64(p.Events()))
		}
	case http.StatusForbidden:
		e.polls.forbidden.Add(1)
	case http.StatusServiceUnavailable:
		if s.hub == "A" {
			e.polls.overloaded.Add(1)
		} else {
			e.polls.closedB.Add(1)
		}
	case http.StatusBadRequest:
		e.polls.badRequests.Add(1)
	}
	return p
}
