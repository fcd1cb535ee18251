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

	"github.com/replayd/replayd/internal/wiretest"
)

// checkPolls checks every poll answer against the ledger; the violations'
// traces go to v.r.
func (v *view) checkPolls(sessions []*PollSession) {
	r := v.r
	for _, s := range sessions {
		r.Sessions++
		r.PollModes[s.Mode]++
		prev := prevHub(s.After)
		resumed, exact := prev != "" && prev != s.Server.Name, false
		for i, p := range s.Polls {
			n, err := v.checkPoll(s, p)
			if err == nil && i == 0 && s.After != nil {
				if _, cursor := s.After.end(); cursor != p.Sent {
					err = fmt.Errorf("resumed from %q, but the visit it resumed from (on hub %s) left it at %q", p.Sent, prev, cursor)
				}
			}
			if err == nil && i > 0 && s.Polls[i-1].Status == http.StatusOK && p.Sent != strconv.FormatInt(s.Polls[i-1].ans.Cursor, 10) {
				err = fmt.Errorf("sent cursor %q, the answer before gave %d", p.Sent, s.Polls[i-1].ans.Cursor)
			}
			if err != nil {
				r.Violations = append(r.Violations, v.tracePoll(s, i, err))
				resumed = false
				break
			}
			if p.Status == http.StatusOK {
				r.Answers++
				r.PollEvents += n
				if p.gap != nil {
					r.PollGaps[p.gap.Reason]++
					resumed = false // not exact: nothing before the gap proves anything
				}
				if n > 0 && resumed {
					exact = true
				}
			}
		}
		if prev != "" && prev != s.Server.Name {
			r.PollResumes++
			if exact {
				r.PollExactResumes++
			}
		}
	}
}

// checkPoll checks one poll; it returns the number of events checked.
func (v *view) checkPoll(s *PollSession, p *Poll) (int, error) {
	srv := s.Server
	finalHead := v.in.Head
	denied := srv.denies(s.Topics)
	switch p.Status {
	case 0:
		return 0, nil // dropped: retried
	case http.StatusOK:
		if denied {
			return 0, errors.New("answered a scope Authorize denies")
		}
		if p.Revoked == RevokedBefore {
			return 0, errors.New("answered a poll whose access was revoked before it was sent")
		}
	case http.StatusForbidden:
		if !denied && p.Revoked == "" {
			return 0, errors.New("403 for a scope Authorize grants")
		}
		return 0, nil
	case http.StatusServiceUnavailable:
		if lo := srv.OverloadRetry; lo > 0 {
			// The overload answer: Retry-After in whole seconds, from a
			// delay in [1×, 2×] OverloadRetry, rounded up.
			n, err := strconv.ParseInt(p.RetryAfter, 10, 64)
			if lo, hi := (lo.Milliseconds()+999)/1000, (2*lo.Milliseconds()+999)/1000; err != nil || n < lo || n > hi {
				return 0, fmt.Errorf("503 with Retry-After %q, want %d to %d", p.RetryAfter, lo, hi)
			}
		} else if !srv.Unavailable {
			return 0, errors.New("503 from a hub that neither caps connections nor closes")
		}
		return 0, nil
	case http.StatusBadRequest:
		if s.Mode != "invalid" {
			return 0, errors.New("400 for a valid request")
		}
		return 0, nil
	default:
		return 0, fmt.Errorf("status %d", p.Status)
	}
	if s.Mode == "invalid" {
		return 0, fmt.Errorf("invalid cursor %q answered 200", p.Sent)
	}
	if p.err != "" {
		return 0, errors.New(p.err)
	}
	a := p.ans
	limit := min(p.Limit, 1000) // PollOptions.MaxLimit's default
	switch {
	case !slices.Equal(a.Topics, s.Topics) && (len(s.Topics) > 0 || len(a.Topics) > 0):
		return 0, fmt.Errorf("answer topics %q, request topics %q", a.Topics, s.Topics)
	case a.Head < 0 || a.Head > finalHead:
		return 0, fmt.Errorf("head %d is outside 0..%d", a.Head, finalHead)
	case a.Head < p.Known:
		return 0, fmt.Errorf("head %d, but %d was committed before the request", a.Head, p.Known)
	case len(a.Events) > limit:
		return 0, fmt.Errorf("%d events, limit %d", len(a.Events), limit)
	case p.gap != nil && p.gap.ReplayLimit != limit:
		return 0, fmt.Errorf("gap replayLimit %d, want %d", p.gap.ReplayLimit, limit)
	}
	// The page is cut by bytes too (PROTOCOL.md, Polling): no event once
	// those before it hold wiretest.PollPageBytes of payload; more with
	// fewer than limit events only when they do.
	size := 0
	for i, ev := range a.Events {
		if size >= wiretest.PollPageBytes {
			return 0, fmt.Errorf("event %d (%d of %d) after %d bytes of payload", ev.seq, i+1, len(a.Events), size)
		}
		size += v.bySeq[ev.seq].size
	}
	if a.More && len(a.Events) < limit {
		if size < wiretest.PollPageBytes {
			return 0, fmt.Errorf("more with %d events (%d bytes of payload), limit %d", len(a.Events), size, limit)
		}
		v.r.PollByteCuts++
	}
	covered := [2]int64{1, 0} // the gap's range, inclusive; empty when from > through
	var prev int64
	checkHoles := true
	if p.Sent == "" {
		// Fresh: no gap, no events, the head; a fresh long poll is held
		// from the head, which the answer does not tell when it has events.
		switch {
		case p.gap != nil && (p.Wait == 0 || p.gap.Reason != reasonPruned):
			return 0, fmt.Errorf("fresh poll answered with gap %s", p.gapData)
		case p.Wait == 0 && (len(a.Events) > 0 || a.Cursor != a.Head):
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
		sent, ok := parseCursor(p.Sent)
		if !ok {
			return 0, fmt.Errorf("sent cursor %q is invalid", p.Sent)
		}
		prev = sent
		if sent > a.Head || (p.gap != nil && p.gap.Reason == reasonUnknownCursor && v.foreign(sent)) {
			g := p.gap
			if g == nil || g.Reason != reasonUnknownCursor || g.ResumedFrom == nil || *g.ResumedFrom != sent ||
				g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil || a.Cursor != a.Head || len(a.Events) > 0 || a.More {
				return 0, fmt.Errorf("cursor %d above head %d: cursor %d, %d events, gap %s", sent, a.Head, a.Cursor, len(a.Events), p.gapData)
			}
			return 0, nil
		}
	}
	if g := p.gap; g != nil && (p.Sent != "" || g.Reason == reasonPruned) {
		if g.Reason != reasonPruned || g.ResumedFrom == nil || *g.ResumedFrom != prev || g.MissedFrom == nil || *g.MissedFrom != prev+1 ||
			g.MissedThrough == nil || *g.MissedThrough < prev+1 || *g.MissedThrough > a.Head || g.Missed != nil {
			return 0, fmt.Errorf("gap %s after cursor %d, head %d", p.gapData, prev, a.Head)
		}
		// Honest: some event of the scope in the range was pruned.
		if !slices.ContainsFunc(v.visibleIn(s.Topics, prev, *g.MissedThrough+1), func(s int64) bool { return !v.inDB[s] }) {
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
		case !visible(s.Topics, en.topic):
			return 0, fmt.Errorf("event %d of topic %q answered to scope %q", ev.seq, en.topic, s.Topics)
		case (ev.topic == nil) != (en.topic == "") || (ev.topic != nil && *ev.topic != en.topic):
			return 0, fmt.Errorf("event %d: topic %v, published on %q", ev.seq, ev.topic, en.topic)
		case ev.hash != en.polled:
			return 0, fmt.Errorf("event %d: type or data differ from what was published", ev.seq)
		}
		if checkHoles {
			// Events of the scope inside the pruned gap's range may follow
			// it (topics pruned apart keep some there), and every one
			// still in the log at the end must: an answer holds the oldest
			// events above its cursor.
			for _, s := range v.visibleIn(s.Topics, prev, ev.seq) {
				if s < covered[0] || s > covered[1] || v.inDB[s] {
					return 0, &holeError{seq: s, prev: prev, next: ev.seq}
				}
			}
		}
		checkHoles = true
		prev = ev.seq
	}
	want := prev
	if len(a.Events) == 0 && covered[0] <= covered[1] {
		want = covered[1] // a pruned gap alone moves the cursor past its range
	}
	if a.Cursor != want && (len(a.Events) > 0 || p.Sent != "") {
		return 0, fmt.Errorf("answer cursor %d, want %d", a.Cursor, want)
	}
	return len(a.Events), nil
}

// tracePoll describes a violating poll session around poll i.
func (v *view) tracePoll(s *PollSession, i int, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION (seed %d) poll session %d of %s: hub %s, topics %q, mode %s (from hub %q); ended: %s\n  poll %d: %v\n",
		v.in.Seed, s.ID, s.Client, s.Server.Name, s.Topics, s.Mode, prevHub(s.After), s.End, i, err)
	var hole *holeError
	if errors.As(err, &hole) {
		en := v.bySeq[hole.seq]
		fmt.Fprintf(&b, "  missing event %d: topic %q, type %q, id %s, still in the log at the end: %v\n",
			hole.seq, en.topic, en.typ, en.eventID, v.inDB[hole.seq])
	}
	for j := max(0, i-3); j <= i; j++ {
		p := s.Polls[j]
		var ids []int64
		for _, ev := range p.ans.Events {
			ids = append(ids, ev.seq)
		}
		if len(ids) > 12 {
			ids = append(ids[:6], ids[len(ids)-6:]...)
		}
		fmt.Fprintf(&b, "  poll %d at %v..%v: cursor %q limit %d wait %v known %d → status %d, cursor %d, head %d, more %v, gap %s, %d events %v\n",
			j, p.Start.Round(time.Millisecond), p.Stop.Round(time.Millisecond), p.Sent, p.Limit, p.Wait, p.Known, p.Status,
			p.ans.Cursor, p.ans.Head, p.ans.More, p.gapData, len(p.ans.Events), ids)
	}
	v.in.Timeline.write(&b, s.Polls[i].Start, s.Polls[i].Stop)
	return b.String()
}
