package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Poll clients in TestChaos (SPEC §11): next to the SSE clients, clients
// that poll either hub in sessions of consecutive polls, each passing back
// the cursor of the answer before, with varied limits, waits (0 and long
// polls) and scopes, from fresh, resumed, stale, future and invalid
// cursors, and from an SSE client's last id; SSE connections in turn
// sometimes resume from a poll client's cursor (mode "poll"): one cursor
// for both transports. Every
// answer is checked against the ledger by the rules checkConn applies to a
// stream: ids strictly increasing from the cursor sent, every event a
// published one of the scope with its type and data, every visible event
// above the cursor returned or inside the answer's gap, nothing outside the
// granted scope.

const chaosPollClients = 8

// chaosPollState is the poll clients' share of a chaos run.
type chaosPollState struct {
	sseLast  [chaosClients]atomic.Value     // each SSE client's last id (string)
	pollLast [chaosPollClients]atomic.Value // each poll client's last cursor (string)

	mu       sync.Mutex
	sessions [][]*chaosPollSession // by poll client
	reached  []bool

	polls, answers, longPolls, events, fromSSE           atomic.Int64
	overloaded, forbidden, closedB, dropped, badRequests atomic.Int64
}

// chaosPollSession is a run of consecutive polls on one hub and scope.
type chaosPollSession struct {
	id, client int
	hub        string   // "A" or "B"
	topics     []string // the scope; none: global
	mode       string   // fresh, resume, sse, stale, future, invalid
	polls      []*chaosPoll
	end        string
}

// chaosPoll is one poll request and its answer, reduced to what the
// checker needs.
type chaosPoll struct {
	sent        string // the cursor sent, "" for none
	limit       int    // as sent
	wait        time.Duration
	status      int
	retryAfter  string
	err         string // a malformed answer
	ans         chaosPollAnswer
	gap         *gapJSON
	gapData     string
	start, stop time.Duration
}

type chaosPollAnswer struct {
	Topics []string         `json:"topics"`
	Cursor int64            `json:"cursor"`
	Head   int64            `json:"head"`
	More   bool             `json:"more"`
	Events []chaosPollEvent `json:"-"` // filled by parse
}

type chaosPollEvent struct {
	seq   int64
	topic *string
	hash  uint64
}

// chaosPollHash is the hash of an event's type and data as a poll answer
// carries them: the stored JSON, compacted by encoding/json.
func chaosPollHash(typ string, payload json.RawMessage) uint64 {
	b, err := json.Marshal(payload)
	if err != nil {
		return 0
	}
	return chaosHash(typ, string(b))
}

// startPollClients starts the poll clients on wg; their results are in
// e.polls once wg is done.
func (e *chaosEnv) startPollClients(seed uint64, wg *sync.WaitGroup) {
	e.polls.sessions = make([][]*chaosPollSession, chaosPollClients)
	e.polls.reached = make([]bool, chaosPollClients)
	for c := range chaosPollClients {
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
func (e *chaosEnv) pollClient(idx int, rng *rand.Rand) (sessions []*chaosPollSession, reached bool) {
	lastID := ""
	for {
		select {
		case <-e.finishDeadline:
			return sessions, false
		default:
		}
		s := &chaosPollSession{id: int(e.connSeq.Add(1)), client: idx, hub: "A", topics: chaosScope(rng)}
		if rng.IntN(5) < 2 {
			s.hub = "B"
		}
		cursor := ""
		switch r := rng.IntN(20); {
		case r < 8 && lastID != "":
			s.mode, cursor = "resume", lastID
		case r < 12:
			// An SSE client's last id: the two transports share a cursor.
			if id, _ := e.polls.sseLast[rng.IntN(chaosClients)].Load().(string); id != "" {
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
func (e *chaosEnv) pollCursor(rng *rand.Rand) string {
	id, _ := e.polls.pollLast[rng.IntN(chaosPollClients)].Load().(string)
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
func (p *chaosPoll) passes(fence int64) bool {
	if p.status != http.StatusOK || p.err != "" {
		return false
	}
	if p.ans.Cursor >= fence {
		return true
	}
	return p.gap != nil && p.gap.MissedThrough != nil && *p.gap.MissedThrough >= fence
}

// pollOnce makes one poll request and records its answer.
func (e *chaosEnv) pollOnce(s *chaosPollSession, cursor string, limit int, wait time.Duration) *chaosPoll {
	p := &chaosPoll{sent: cursor, limit: limit, wait: wait, start: time.Since(e.start)}
	defer func() { p.stop = time.Since(e.start) }()
	e.polls.polls.Add(1)
	if wait > 0 {
		e.polls.longPolls.Add(1)
	}
	base := e.urlA
	if s.hub == "B" {
		base = e.urlB
	}
	q := url.Values{}
	for _, t := range s.topics {
		q.Add("topic", t)
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	q.Set("limit", strconv.Itoa(limit))
	if wait > 0 {
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait+waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/poll?"+q.Encode(), nil)
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
func (p *chaosPoll) parse(body []byte) error {
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
		p.gap, p.gapData = new(gapJSON), g
		if err := chaosParseGap(g, p.gap); err != nil {
			return err
		}
	}
	var events []map[string]json.RawMessage
	if err := json.Unmarshal(keys["events"], &events); err != nil || events == nil {
		return fmt.Errorf("events %.200s: %v", keys["events"], err)
	}
	for _, ev := range events {
		var pe chaosPollEvent
		var typ string
		if len(ev) != 4 || json.Unmarshal(ev["id"], &pe.seq) != nil || json.Unmarshal(ev["type"], &typ) != nil ||
			json.Unmarshal(ev["topic"], &pe.topic) != nil || ev["data"] == nil {
			return fmt.Errorf("event %v: want id, type, topic and data", ev)
		}
		pe.hash = chaosHash(typ, string(ev["data"]))
		p.ans.Events = append(p.ans.Events, pe)
	}
	return nil
}

// checkPolls checks every poll answer against the ledger, and that every
// poll client reached the fence; it returns the violations' traces.
func (e *chaosEnv) checkPolls(v *chaosView, finalHead int64) (violations []string) {
	t := e.t
	fence := e.fence.Load()
	var sessions, answers, events int
	gaps := map[string]int{}
	modes := map[string]int{}
	for c, ss := range e.polls.sessions {
		if !e.polls.reached[c] {
			t.Errorf("poll client %d never reached the fence %d", c, fence)
		}
		for _, s := range ss {
			sessions++
			modes[s.mode]++
			for i, p := range s.polls {
				n, err := e.checkPoll(v, s, p, finalHead)
				if err == nil && i > 0 && s.polls[i-1].status == http.StatusOK && p.sent != strconv.FormatInt(s.polls[i-1].ans.Cursor, 10) {
					err = fmt.Errorf("sent cursor %q, the answer before gave %d", p.sent, s.polls[i-1].ans.Cursor)
				}
				if err != nil {
					violations = append(violations, e.tracePoll(v, s, i, err))
					break
				}
				if p.status == http.StatusOK {
					answers++
					events += n
					if p.gap != nil {
						gaps[p.gap.Reason]++
					}
				}
			}
		}
	}
	ps := &e.polls
	t.Logf("poll clients: %d sessions (%v; %d from an SSE client's id), %d polls (%d long), %d answers checked with %d events; gaps %v; "+
		"refused: %d by Authorize, %d by MaxConnections on hub A, %d by hub B closing; %d dropped, %d invalid cursors refused",
		sessions, modes, ps.fromSSE.Load(), ps.polls.Load(), ps.longPolls.Load(), answers, events, gaps,
		ps.forbidden.Load(), ps.overloaded.Load(), ps.closedB.Load(), ps.dropped.Load(), ps.badRequests.Load())
	return violations
}

// checkPoll checks one poll; it returns the number of events checked.
func (e *chaosEnv) checkPoll(v *chaosView, s *chaosPollSession, p *chaosPoll, finalHead int64) (int, error) {
	denied := s.hub == "A" && e.deniedScope(s.topics)
	switch p.status {
	case 0:
		return 0, nil // dropped: retried
	case http.StatusOK:
		if denied {
			return 0, errors.New("answered a scope Authorize denies")
		}
	case http.StatusForbidden:
		if !denied {
			return 0, errors.New("403 for a scope Authorize grants")
		}
		return 0, nil
	case http.StatusServiceUnavailable:
		if s.hub == "A" {
			// The overload answer: Retry-After in whole seconds, from a
			// delay in [1×, 2×] OverloadRetry (50–100 ms here).
			if p.retryAfter != "1" {
				return 0, fmt.Errorf("503 with Retry-After %q, want 1", p.retryAfter)
			}
		}
		return 0, nil
	case http.StatusBadRequest:
		if s.mode != "invalid" {
			return 0, errors.New("400 for a valid request")
		}
		return 0, nil
	default:
		return 0, fmt.Errorf("status %d", p.status)
	}
	if s.mode == "invalid" {
		return 0, fmt.Errorf("invalid cursor %q answered 200", p.sent)
	}
	if p.err != "" {
		return 0, errors.New(p.err)
	}
	a := p.ans
	limit := min(p.limit, 1000) // PollOptions.MaxLimit's default
	switch {
	case !slices.Equal(a.Topics, s.topics) && (len(s.topics) > 0 || len(a.Topics) > 0):
		return 0, fmt.Errorf("answer topics %q, request topics %q", a.Topics, s.topics)
	case a.Head < 0 || a.Head > finalHead:
		return 0, fmt.Errorf("head %d is outside 0..%d", a.Head, finalHead)
	case len(a.Events) > limit:
		return 0, fmt.Errorf("%d events, limit %d", len(a.Events), limit)
	case a.More && len(a.Events) != limit:
		return 0, fmt.Errorf("more with %d events, limit %d", len(a.Events), limit)
	case p.gap != nil && p.gap.ReplayLimit != limit:
		return 0, fmt.Errorf("gap replayLimit %d, want %d", p.gap.ReplayLimit, limit)
	}
	covered := [2]int64{1, 0} // the gap's range, inclusive; empty when from > through
	var prev int64
	checkHoles := true
	if p.sent == "" {
		// Fresh: no gap, no events, the head; a fresh long poll is held
		// from the head, which the answer does not tell when it has events.
		switch {
		case p.gap != nil && (p.wait == 0 || p.gap.Reason != reasonPruned):
			return 0, fmt.Errorf("fresh poll answered with gap %s", p.gapData)
		case p.wait == 0 && (len(a.Events) > 0 || a.Cursor != a.Head):
			return 0, fmt.Errorf("fresh poll: %d events, cursor %d, head %d", len(a.Events), a.Cursor, a.Head)
		}
		switch {
		case p.gap != nil:
			prev = *p.gap.ResumedFrom
		case len(a.Events) > 0:
			prev, checkHoles = a.Events[0].seq-1, false
		default:
			prev = a.Cursor
		}
	} else {
		sent, ok := parseCursor(p.sent)
		if !ok {
			return 0, fmt.Errorf("sent cursor %q is invalid", p.sent)
		}
		prev = sent
		if sent > a.Head {
			g := p.gap
			if g == nil || g.Reason != reasonUnknownCursor || g.ResumedFrom == nil || *g.ResumedFrom != sent ||
				g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil || a.Cursor != a.Head || len(a.Events) > 0 || a.More {
				return 0, fmt.Errorf("cursor %d above head %d: cursor %d, %d events, gap %s", sent, a.Head, a.Cursor, len(a.Events), p.gapData)
			}
			return 0, nil
		}
	}
	if g := p.gap; g != nil && (p.sent != "" || g.Reason == reasonPruned) {
		if g.Reason != reasonPruned || g.ResumedFrom == nil || *g.ResumedFrom != prev || g.MissedFrom == nil || *g.MissedFrom != prev+1 ||
			g.MissedThrough == nil || *g.MissedThrough < prev+1 || *g.MissedThrough > a.Head || g.Missed != nil {
			return 0, fmt.Errorf("gap %s after cursor %d, head %d", p.gapData, prev, a.Head)
		}
		// Honest: some event of the scope in the range was pruned.
		if !slices.ContainsFunc(v.visibleIn(s.topics, prev, *g.MissedThrough+1), func(s int64) bool { return !v.inDB[s] }) {
			return 0, fmt.Errorf("pruned gap %s, but every event of the scope in its range is still in the log", p.gapData)
		}
		covered = [2]int64{*g.MissedFrom, *g.MissedThrough}
	}
	for _, ev := range a.Events {
		en, ok := v.bySeq[ev.seq]
		switch {
		case ev.seq <= prev:
			return 0, fmt.Errorf("event %d after %d: ids not strictly increasing", ev.seq, prev)
		case ev.seq > a.Head:
			return 0, fmt.Errorf("event %d above the answer's head %d", ev.seq, a.Head)
		case !ok:
			return 0, fmt.Errorf("event %d was never published", ev.seq)
		case !chaosVisible(s.topics, en.topic):
			return 0, fmt.Errorf("event %d of topic %q answered to scope %q", ev.seq, en.topic, s.topics)
		case (ev.topic == nil) != (en.topic == "") || (ev.topic != nil && *ev.topic != en.topic):
			return 0, fmt.Errorf("event %d: topic %v, published on %q", ev.seq, ev.topic, en.topic)
		case ev.hash != v.polls[ev.seq]:
			return 0, fmt.Errorf("event %d: type or data differ from what was published", ev.seq)
		case covered[0] <= covered[1] && ev.seq <= covered[1]:
			return 0, fmt.Errorf("event %d inside or below the gap's range %d..%d", ev.seq, covered[0], covered[1])
		}
		if checkHoles {
			for _, s := range v.visibleIn(s.topics, prev, ev.seq) {
				if s < covered[0] || s > covered[1] {
					return 0, &chaosHole{seq: s, prev: prev, next: ev.seq}
				}
			}
		}
		checkHoles = true
		prev = ev.seq
	}
	if want := prev; a.Cursor != want && (len(a.Events) > 0 || p.sent != "") {
		return 0, fmt.Errorf("answer cursor %d, want %d", a.Cursor, want)
	}
	return len(a.Events), nil
}

// tracePoll describes a violating poll session around poll i.
func (e *chaosEnv) tracePoll(v *chaosView, s *chaosPollSession, i int, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION (seed %d) poll session %d of poll client %d: hub %s, topics %q, mode %s; ended: %s\n  poll %d: %v\n",
		e.seed, s.id, s.client, s.hub, s.topics, s.mode, s.end, i, err)
	var hole *chaosHole
	if errors.As(err, &hole) {
		en := v.bySeq[hole.seq]
		fmt.Fprintf(&b, "  missing event %d: topic %q, type %q, id %s, still in the log at the end: %v\n",
			hole.seq, en.topic, en.typ, en.eventID, v.inDB[hole.seq])
	}
	for j := max(0, i-3); j <= i; j++ {
		p := s.polls[j]
		var ids []int64
		for _, ev := range p.ans.Events {
			ids = append(ids, ev.seq)
		}
		if len(ids) > 12 {
			ids = append(ids[:6], ids[len(ids)-6:]...)
		}
		fmt.Fprintf(&b, "  poll %d at %v..%v: cursor %q limit %d wait %v → status %d, cursor %d, head %d, more %v, gap %s, %d events %v\n",
			j, p.start.Round(time.Millisecond), p.stop.Round(time.Millisecond), p.sent, p.limit, p.wait, p.status,
			p.ans.Cursor, p.ans.Head, p.ans.More, p.gapData, len(p.ans.Events), ids)
	}
	p := s.polls[i]
	e.timeline.mu.Lock()
	for _, m := range e.timeline.entries {
		if m.at >= p.start-200*time.Millisecond && m.at <= p.stop {
			fmt.Fprintf(&b, "  at %v: %s\n", m.at.Round(time.Millisecond), m.what)
		}
	}
	e.timeline.mu.Unlock()
	return b.String()
}
