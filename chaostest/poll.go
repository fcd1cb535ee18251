package chaostest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// Poll clients (SPEC §11): next to the SSE clients, clients that poll
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
	sessions [][]*pollSession // by poll client
	reached  []bool

	polls, answers, longPolls, events, fromSSE           atomic.Int64
	overloaded, forbidden, closedB, dropped, badRequests atomic.Int64
}

// pollSession is a run of consecutive polls on one hub and scope.
type pollSession struct {
	id, client int
	hub        string   // "A" or "B"
	topics     []string // the scope; none: global
	mode       string   // fresh, resume, sse, stale, future, invalid
	polls      []*poll
	end        string
}

// poll is one poll request and its answer, reduced to what the
// checker needs.
type poll struct {
	sent        string // the cursor sent, "" for none
	limit       int    // as sent
	wait        time.Duration
	status      int
	retryAfter  string
	err         string // a malformed answer
	ans         pollAnswer
	gap         *wiretest.Gap
	gapData     string
	start, stop time.Duration
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

// pollHash is the hash of an event's type and data as a poll answer
// carries them: the stored JSON, compacted by encoding/json.
func pollHash(typ string, payload json.RawMessage) uint64 {
	b, err := json.Marshal(payload)
	if err != nil {
		return 0
	}
	return frameHash(typ, string(b))
}

// startPollClients starts the poll clients on wg; their results are in
// e.polls once wg is done.
func (e *env) startPollClients(seed uint64, wg *sync.WaitGroup) {
	e.polls.sessions = make([][]*pollSession, numPollClients)
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
func (e *env) pollClient(idx int, rng *rand.Rand) (sessions []*pollSession, reached bool) {
	lastID := ""
	for {
		select {
		case <-e.finishDeadline:
			return sessions, false
		default:
		}
		s := &pollSession{id: int(e.connSeq.Add(1)), client: idx, hub: "A", topics: drawScope(rng)}
		if rng.IntN(5) < 2 {
			s.hub = "B"
		}
		cursor := ""
		switch r := rng.IntN(20); {
		case r < 8 && lastID != "":
			s.mode, cursor = "resume", lastID
		case r < 12:
			// An SSE client's last id: the two transports share a cursor.
			if id, _ := e.polls.sseLast[rng.IntN(numClients)].Load().(string); id != "" {
				s.mode, cursor = "sse", id
				e.polls.fromSSE.Add(1)
			} else {
				s.mode = "fresh"
			}
		case r < 15:
			s.mode = "fresh"
		case r < 18:
			s.mode, cursor = "stale", strconv.FormatInt(rng.Int64N(e.ledger.max()+1), 10)
		case r < 19:
			s.mode, cursor = "future", strconv.FormatInt(e.ledger.max()+1_000_000+rng.Int64N(1000), 10)
		default:
			s.mode, cursor = "invalid", []string{"abc", "-1", "1.5", "18446744073709551616", "0x1f", " 7"}[rng.IntN(6)]
		}
		if finishing(e.finish) && lastID != "" {
			s.mode, cursor = "resume", lastID
		}
		sessions = append(sessions, s)
		n := 1 + rng.IntN(20)
		for k := 0; ; k++ {
			fin := finishing(e.finish)
			if k >= n && !fin {
				s.end = fmt.Sprintf("session of %d polls done", k)
				break
			}
			select {
			case <-e.finishDeadline:
				s.end = "gave up waiting for the fence"
				return sessions, false
			default:
			}
			limit := []int{1, 2, 3, 10, 50, 100, 1000, 5000}[rng.IntN(8)]
			var wait time.Duration
			if fin || rng.IntN(2) == 0 {
				wait = time.Duration(50+rng.IntN(1500)) * time.Millisecond
			}
			p := e.pollOnce(s, cursor, limit, wait)
			s.polls = append(s.polls, p)
			if s.mode == "invalid" {
				s.end = "invalid cursor"
				break
			}
			if p.status == http.StatusForbidden {
				s.end = "refused by Authorize"
				break
			}
			if p.status != http.StatusOK {
				// Overloaded, a hub B closing under a restart, a dropped
				// connection: the same poll again shortly.
				time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
				continue
			}
			if p.err != "" {
				s.end = "malformed answer"
				break
			}
			cursor = strconv.FormatInt(p.ans.Cursor, 10)
			lastID = cursor
			e.polls.pollLast[idx].Store(cursor)
			if fence := e.fence.Load(); fence > 0 && p.passes(fence) {
				s.end = "reached the fence"
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

// passes reports whether an answer accounts for every event up to fence.
func (p *poll) passes(fence int64) bool {
	if p.status != http.StatusOK || p.err != "" {
		return false
	}
	if p.ans.Cursor >= fence {
		return true
	}
	return p.gap != nil && p.gap.MissedThrough != nil && *p.gap.MissedThrough >= fence
}

// pollOnce makes one poll request and records its answer.
func (e *env) pollOnce(s *pollSession, cursor string, limit int, wait time.Duration) *poll {
	p := &poll{sent: cursor, limit: limit, wait: wait, start: time.Since(e.start)}
	defer func() { p.stop = time.Since(e.start) }()
	e.polls.polls.Add(1)
	if wait > 0 {
		e.polls.longPolls.Add(1)
	}
	q := scopeQuery(s.topics)
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	q.Set("limit", strconv.Itoa(limit))
	if wait > 0 {
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait+waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url(s.hub, "/poll", q), nil)
	if err != nil {
		p.err = err.Error()
		return p
	}
	resp, err := e.httpc.Do(req)
	if err != nil {
		e.polls.dropped.Add(1)
		return p // status 0: retried
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	p.status, p.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	if err != nil {
		e.polls.dropped.Add(1)
		p.status = 0
		return p
	}
	switch p.status {
	case http.StatusOK:
	case http.StatusForbidden:
		e.polls.forbidden.Add(1)
		return p
	case http.StatusServiceUnavailable:
		if s.hub == "A" {
			e.polls.overloaded.Add(1)
		} else {
			e.polls.closedB.Add(1)
		}
		return p
	case http.StatusBadRequest:
		e.polls.badRequests.Add(1)
		return p
	default:
		p.err = fmt.Sprintf("status %d: %.200s", p.status, body)
		return p
	}
	if err := p.parse(body); err != nil {
		p.err = err.Error()
		return p
	}
	e.polls.answers.Add(1)
	e.polls.events.Add(int64(len(p.ans.Events)))
	return p
}

// parse reads an answer: all six keys, the gap's six keys, each event's
// four.
func (p *poll) parse(body []byte) error {
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
