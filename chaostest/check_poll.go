package chaostest

// The oracle's share of the poll clients: every answer against the ledger.

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// checkPolls checks every poll answer against the ledger, and that every
// poll client reached the fence; it returns the violations' traces.
func (e *env) checkPolls(v *view, finalHead int64) (violations []string) {
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
func (e *env) checkPoll(v *view, s *pollSession, p *poll, finalHead int64) (int, error) {
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
		case !visible(s.topics, en.topic):
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
					return 0, &holeError{seq: s, prev: prev, next: ev.seq}
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
func (e *env) tracePoll(v *view, s *pollSession, i int, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION (seed %d) poll session %d of poll client %d: hub %s, topics %q, mode %s; ended: %s\n  poll %d: %v\n",
		e.seed, s.id, s.client, s.hub, s.topics, s.mode, s.end, i, err)
	var hole *holeError
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
	e.timeline.write(&b, s.polls[i].start, s.polls[i].stop)
	return b.String()
}
