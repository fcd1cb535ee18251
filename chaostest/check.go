package chaostest

// The oracle: the log against the ledger, every SSE connection against
// the guarantee and the wire protocol (PROTOCOL.md), the in-process
// subscribers (check_poll.go: every poll answer against the poll transport).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// The gap reasons (PROTOCOL.md, "gap").
const (
	reasonReplayLimit   = "replay_limit"
	reasonPruned        = "pruned"
	reasonUnknownCursor = "unknown_cursor"
	reasonInvalidCursor = "invalid_cursor"
)

// parseCursor parses a cursor as PROTOCOL.md's cursor grammar does: ASCII digits only, within
// int64.
func parseCursor(s string) (int64, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	c, err := strconv.ParseInt(s, 10, 64)
	return c, err == nil
}

// view is the ledger frozen for checking.
type view struct {
	in    Input
	r     *Report
	bySeq map[int64]entry
	seqs  []int64 // ascending
	inDB  map[int64]bool
	mark  int64 // the global prune watermark
	errs  []string
}

func (v *view) fail(format string, args ...any) {
	v.errs = append(v.errs, fmt.Sprintf(format, args...))
}

func visible(scope []string, topic string) bool {
	return len(scope) == 0 || topic == "" || slices.Contains(scope, topic)
}

// foreign reports whether the log may not have issued the cursor c: it is
// no event's sequence (and not 0), so it may lie in a range the sequence
// floor skipped, where an unknown_cursor gap is its due.
func (v *view) foreign(c int64) bool {
	_, ok := v.bySeq[c]
	return c != 0 && !ok
}

// visibleIn returns the ledger sequences visible to scope in (after, before).
func (v *view) visibleIn(scope []string, after, before int64) []int64 {
	i, _ := slices.BinarySearch(v.seqs, after+1)
	var out []int64
	for ; i < len(v.seqs) && v.seqs[i] < before; i++ {
		if visible(scope, v.bySeq[v.seqs[i]].topic) {
			out = append(out, v.seqs[i])
		}
	}
	return out
}

// ReadLog reads, through h, every event retained in the log, ascending,
// and the global prune watermark: the end of the pruned gap a global poll
// from cursor 0 is owed (0 when none is). With LatestSequence, what Check
// needs of the log at the end.
func ReadLog(ctx context.Context, h *replayd.EventHub) (rows []replayd.Event, mark int64, err error) {
	var after int64
	for {
		evs, err := h.Replay(ctx, "", after, 1000)
		if err != nil {
			return nil, 0, err
		}
		if len(evs) == 0 {
			break
		}
		rows = append(rows, evs...)
		after = evs[len(evs)-1].Sequence
	}
	rec := httptest.NewRecorder()
	h.PollHandler().ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/poll?cursor=0&limit=1", nil))
	var ans struct{ Gap *wiretest.Gap }
	if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil || rec.Code != http.StatusOK {
		return nil, 0, fmt.Errorf("poll from cursor 0: status %d, %q: %v", rec.Code, rec.Body, err)
	}
	if g := ans.Gap; g != nil {
		if g.Reason != reasonPruned || g.MissedThrough == nil {
			return nil, 0, fmt.Errorf("poll from cursor 0: gap %s", g.String())
		}
		mark = *g.MissedThrough
	}
	return rows, mark, nil
}

// Input is what Check checks: the ledger, the log at the end (every
// publisher done, every client done), and the records.
type Input struct {
	Ledger *Ledger
	// Log is every row of the log at the end, ascending, and Mark the
	// global prune watermark then (ReadLog); Head is the head then
	// (LatestSequence), which must be the newest event published.
	Log  []replayd.Event
	Mark int64
	Head int64

	Conns []*Conn
	Polls []*PollSession
	// Subscribers must each have seen, in order, every event above their
	// start through Head that is still in the log.
	Subscribers []*Subscriber
	// ClientRuns are the Runs of Go clients (package client).
	ClientRuns []*ClientRun

	Seed     uint64    // printed in every trace
	Timeline *Timeline // its moments around a violation go in the trace; may be nil
}

// Report is what Check found: the violations, each with a trace, and what
// it checked.
type Report struct {
	Violations []string

	Published int // events in the ledger (published, or attempted and found in the log)
	Adopted   int // of those, attempts whose Publish never returned, found in the log
	Retained  int // rows in the log at the end

	// SSE connections served a stream (the overload answers apart), their
	// frames (heartbeats included), events, those replayed, those served
	// detached; by mode, gap reason and how they ended.
	Conns, Frames, Events, Replayed, Detached int
	Modes, Gaps, Ends                         map[string]int
	// Resumes counts streams whose cursor came from a visit to another hub
	// (After);
	// ExactResumes those of them that went on at the cursor with events
	// and no gap.
	Resumes, ExactResumes int

	// Poll sessions, answers checked (200), the events they carried; by
	// mode and gap reason; resumes as for SSE (by session); answers cut by
	// bytes (more, fewer events than the limit).
	Sessions, Answers, PollEvents int
	PollModes, PollGaps           map[string]int
	PollResumes, PollExactResumes int
	PollByteCuts                  int

	// Runs of Go clients, the events they handed, their gaps by reason.
	ClientRuns, ClientEvents int
	ClientGaps               map[string]int
}

// Log logs what r checked.
func (r *Report) Log(t testing.TB) {
	t.Helper()
	t.Logf("checked %d events (%d attempted with no outcome and found in the log; %d still in the log at the end); %d connections (%d frames, %d events of which %d replayed; %d streams served detached): modes %v; gaps %v; ends %v; %d resumed on another hub, %d of them exactly",
		r.Published, r.Adopted, r.Retained, r.Conns, r.Frames, r.Events, r.Replayed, r.Detached, r.Modes, r.Gaps, r.Ends, r.Resumes, r.ExactResumes)
	t.Logf("checked %d poll sessions (%v), %d answers with %d events (%d cut at 4 MiB of payload); gaps %v; %d sessions resumed on another hub, %d of them exactly",
		r.Sessions, r.PollModes, r.Answers, r.PollEvents, r.PollByteCuts, r.PollGaps, r.PollResumes, r.PollExactResumes)
	t.Logf("checked %d runs of Go clients, %d events handed; gaps %v", r.ClientRuns, r.ClientEvents, r.ClientGaps)
}

// Check checks the log against the ledger, every connection and poll
// answer against the guarantee and PROTOCOL.md (streams and polls), and the subscribers; it returns the
// violations, each with a trace, and what it checked.
func Check(in Input) *Report {
	r := &Report{Modes: map[string]int{}, Gaps: map[string]int{}, Ends: map[string]int{}, PollModes: map[string]int{}, PollGaps: map[string]int{}, ClientGaps: map[string]int{}}
	v := newView(in, r)
	fence := in.Head

	// In-process subscribers: strictly increasing; every event above
	// their start that is still in the log (so was never pruned, so was
	// readable when the hub caught up) delivered.
	for _, s := range in.Subscribers {
		s.mu.Lock()
		got := slices.Clone(s.seqs)
		s.mu.Unlock()
		delivered := map[int64]bool{}
		for i, seq := range got {
			if i > 0 && seq <= got[i-1] {
				v.fail("hub %s subscriber: %d after %d", s.Name, seq, got[i-1])
			}
			delivered[seq] = true
		}
		for _, seq := range v.visibleIn(nil, s.start, fence+1) {
			if v.inDB[seq] && !delivered[seq] {
				v.fail("hub %s subscriber (from %d) never got event %d, which was never pruned", s.Name, s.start, seq)
			}
		}
	}

	// Every connection.
	for _, c := range in.Conns {
		switch {
		case c.Status == 0:
			continue // dropped before the response: retried
		case c.Status == http.StatusForbidden:
			if !c.Server.denies(c.Topics) {
				r.Violations = append(r.Violations, v.trace(c, errors.New("403 for a scope Authorize grants")))
			}
			continue
		case c.Status == http.StatusServiceUnavailable && c.Server.Unavailable:
			continue
		case c.Status != http.StatusOK:
			r.Violations = append(r.Violations, v.trace(c, fmt.Errorf("status %d", c.Status)))
			continue
		}
		if c.Overloaded() {
			if _, err := v.checkConn(c); err != nil {
				r.Violations = append(r.Violations, v.trace(c, err))
			}
			continue
		}
		r.Conns++
		r.Modes[c.Mode]++
		r.Ends[strings.TrimRight(strings.SplitN(strings.SplitN(c.End, " (", 2)[0], " frames", 2)[0], " 0123456789")]++
		r.Frames += len(c.frames) + c.heartbeats
		st, err := v.checkConn(c)
		r.Events += st.events
		r.Replayed += st.replayed
		if st.detached {
			r.Detached++
		}
		if st.gap != "" {
			r.Gaps[st.gap]++
		}
		if err == nil && c.After != nil {
			if _, cursor := c.After.end(); cursor != c.Sent {
				err = fmt.Errorf("resumed from %q, but the visit it resumed from (on hub %s) left it at %q", c.Sent, prevHub(c.After), cursor)
			}
		}
		if hub := prevHub(c.After); hub != "" && hub != c.Server.Name {
			r.Resumes++
			if err == nil && st.gap == "" && st.events > 0 {
				r.ExactResumes++
			}
		}
		if err != nil {
			r.Violations = append(r.Violations, v.trace(c, err))
		}
	}
	v.checkPolls(in.Polls)
	v.checkClientRuns(in.ClientRuns)
	r.Violations = append(v.errs, r.Violations...)
	return r
}

// newView freezes the ledger for checking, cross-checked with the log:
// every row is a ledger event (or an attempted one, which it adopts),
// intact; every ledger event missing from the log was pruned; the head is
// the newest sequence.
func newView(in Input, r *Report) *view {
	l := in.Ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	v := &view{in: in, r: r, bySeq: maps.Clone(l.bySeq), inDB: map[int64]bool{}, mark: in.Mark}
	v.errs = append(v.errs, l.errs...)
	seen := map[int64]bool{}
	adopt := func(seq int64, en entry, when string) {
		if seen[seq] {
			return
		}
		seen[seq] = true
		old, ok := v.bySeq[seq]
		switch {
		case ok && old != en:
			v.fail("row %d (%s) %s differs from what Publish returned", seq, en.eventID, when)
		case ok:
		case l.attempts[en.eventID] == en:
			v.bySeq[seq] = en // an attempt whose outcome was unknown: it committed
			r.Adopted++
		default:
			v.fail("row %d (%s) %s, but no Publish returned it or was attempted with it", seq, en.eventID, when)
		}
	}
	for _, ev := range in.Log {
		adopt(ev.Sequence, newEntry(ev), "is in the log")
		v.inDB[ev.Sequence] = true
	}
	for seq, en := range l.logged {
		adopt(seq, en, "was read from the log during the run")
	}
	for s := range v.bySeq {
		v.seqs = append(v.seqs, s)
	}
	slices.Sort(v.seqs)
	for _, s := range v.seqs {
		if !v.inDB[s] && s > v.mark {
			v.fail("event %d is neither in the log nor below the prune watermark %d", s, v.mark)
		}
	}
	for s := range l.renewed {
		if v.inDB[s] {
			v.fail("a retry of event %d's id stored a new row although %d is still in the log", s, s)
		}
	}
	if n := len(v.seqs); n == 0 || in.Head != v.seqs[n-1] {
		v.fail("head %d, but the newest event published is %v", in.Head, v.seqs[max(0, n-1):])
	}
	r.Published, r.Retained = len(v.seqs), len(in.Log)
	return v
}

type connStats struct {
	events, replayed int
	detached         bool // admitted, and served detached
	gap              string
}

// checkConn checks one connection's frames:
//
//   - retry (hub A), then hello, whose id is its cursor and whose cursor
//     follows from what was sent; then at most one gap, at once, of the
//     reason the cursor calls for, with all its keys and a sane range;
//   - then only events and heartbeats; event ids strictly increasing from
//     the hello's cursor; every event a ledger event visible to the scope,
//     with the published type and data;
//   - between the cursor and each event, every ledger event visible to the
//     scope was delivered or lies in the gap's range: no silent hole; and,
//     inside a pruned gap's range, from the first event delivered on,
//     every one still in the log at the end was delivered (retention per
//     topic keeps events there);
//   - the replay (ids up to the hello's head) is at most the replay
//     limit, all of it when a replay_limit gap was sent, and newer than
//     a replay_limit gap's range (a pruned gap's may hold kept events).
func (v *view) checkConn(c *Conn) (st connStats, err error) {
	fs := c.frames
	srv := c.Server
	limit := srv.ReplayLimit
	finalHead := v.in.Head
	if srv.denies(c.Topics) && !c.Overloaded() {
		// The cap is checked before Authorize: a denied scope may get the
		// overload answer, never a stream.
		return st, fmt.Errorf("served a scope Authorize denies")
	}
	if c.Overloaded() {
		ms, err := strconv.ParseInt(fs[0].data, 10, 64)
		if lo := srv.OverloadRetry.Milliseconds(); err != nil || lo == 0 || ms < lo || ms > 2*lo {
			return st, fmt.Errorf("overload answer retry %q outside [%d, %d] ms", fs[0].data, lo, 2*lo)
		}
		return st, nil
	}
	if c.Revoked == RevokedBefore && (len(fs) > 0 || c.heartbeats > 0) {
		return st, fmt.Errorf("its access was revoked before it was sent, yet it got %d frames and %d heartbeats", len(fs), c.heartbeats)
	}
	if want := srv.Retry.Milliseconds(); want > 0 && len(fs) > 0 {
		if fs[0].kind != 'r' || fs[0].data != strconv.FormatInt(want, 10) {
			return st, fmt.Errorf("first frame is not retry: %d", want)
		}
		fs = fs[1:]
	}
	if len(fs) == 0 {
		return st, nil // ended before the hello
	}
	if fs[0].kind != 'h' {
		return st, fmt.Errorf("first frame is not hello: %q", fs[0].data)
	}
	// An admitted stream of a hub with DetachConnections runs on the
	// connection itself, delimited by its end; of another, through
	// net/http, chunked.
	detach := srv.Detached
	if c.Chunked == detach {
		return st, fmt.Errorf("stream chunked %v on a hub with DetachConnections %v", c.Chunked, detach)
	}
	st.detached = detach
	var hello struct {
		Topic  *string   `json:"topic"`
		Topics *[]string `json:"topics"`
		Cursor *int64    `json:"cursor"`
		Head   *int64    `json:"head"`
	}
	_, data, _ := strings.Cut(fs[0].data, " ")
	if err := json.Unmarshal([]byte(data), &hello); err != nil || hello.Cursor == nil || hello.Head == nil {
		return st, fmt.Errorf("hello data %q: %v", data, err)
	}
	cursor, head := *hello.Cursor, *hello.Head
	switch {
	case fs[0].seq != cursor:
		return st, fmt.Errorf("hello id %d differs from its cursor %d", fs[0].seq, cursor)
	case (hello.Topic == nil) != (len(c.Topics) != 1) || (hello.Topic != nil && *hello.Topic != c.Topics[0]):
		return st, fmt.Errorf("hello topic %v, connection topics %q", hello.Topic, c.Topics)
	case hello.Topics == nil || len(*hello.Topics) != len(c.Topics) || (len(c.Topics) > 0 && !slices.Equal(*hello.Topics, c.Topics)):
		return st, fmt.Errorf("hello topics %v, connection topics %q", hello.Topics, c.Topics)
	case head < 0 || head > finalHead:
		// The head need not be a stored event: a rejected duplicate may
		// consume a sequence (see replayd.Store).
		return st, fmt.Errorf("hello head %d is outside 0..%d", head, finalHead)
	case head < c.Known:
		return st, fmt.Errorf("hello head %d, but %d was committed before the request", head, c.Known)
	}
	fs = fs[1:]

	// What the cursor calls for.
	sent, valid := int64(0), false
	if c.Sent != "" {
		sent, valid = parseCursor(c.Sent)
	}
	var g *wiretest.Gap
	if len(fs) > 0 && fs[0].kind == 'g' {
		parsed, err := wiretest.ParseGap(fs[0].data)
		if err != nil {
			return st, err
		}
		g = &parsed
		st.gap = g.Reason
		fs = fs[1:]
		if g.ReplayLimit != limit {
			return st, fmt.Errorf("gap replayLimit %d, want %d", g.ReplayLimit, limit)
		}
	}
	reason := ""
	if g != nil {
		reason = g.Reason
	}
	var covered [2]int64 // the gap's range, inclusive; empty when from > through
	covered[0] = 1
	switch {
	case c.Sent == "":
		if g != nil || cursor != head {
			return st, fmt.Errorf("fresh connection: cursor %d, head %d, gap %q", cursor, head, reason)
		}
	case !valid:
		if reason != reasonInvalidCursor || g.ResumedFrom != nil || g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil || cursor != head {
			return st, fmt.Errorf("invalid cursor %q: cursor %d, head %d, gap %+v", c.Sent, cursor, head, g)
		}
	case sent > head || (reason == reasonUnknownCursor && v.foreign(sent)):
		if reason != reasonUnknownCursor || g.ResumedFrom == nil || *g.ResumedFrom != sent || g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil || cursor != head {
			return st, fmt.Errorf("cursor %d above head %d: cursor %d, gap %+v", sent, head, cursor, g)
		}
	default:
		if cursor != sent {
			return st, fmt.Errorf("resumed from %d but hello cursor is %d", sent, cursor)
		}
		switch reason {
		case "":
		case reasonReplayLimit:
			if g.ResumedFrom == nil || *g.ResumedFrom != sent || g.MissedFrom == nil || g.MissedThrough == nil || g.Missed == nil {
				return st, fmt.Errorf("replay_limit gap lacks a field: %+v", g)
			}
			from, through, missed := *g.MissedFrom, *g.MissedThrough, *g.Missed
			n := int64(len(v.visibleIn(c.Topics, from-1, through+1)))
			if from <= sent || through < from || through > head || missed < 1 || missed > n ||
				!visible(c.Topics, v.bySeq[from].topic) || !visible(c.Topics, v.bySeq[through].topic) {
				return st, fmt.Errorf("replay_limit gap %d..%d missed %d (ledger: %d visible in range) after cursor %d, head %d",
					from, through, missed, n, sent, head)
			}
			covered = [2]int64{from, through}
		case reasonPruned:
			if g.ResumedFrom == nil || *g.ResumedFrom != sent || g.MissedFrom == nil || *g.MissedFrom != sent+1 ||
				g.MissedThrough == nil || *g.MissedThrough < sent+1 || *g.MissedThrough > head || g.Missed != nil {
				return st, fmt.Errorf("pruned gap %s after cursor %d, head %d", g.String(), sent, head)
			}
			// Honest: some event of the scope in the range was pruned.
			if !slices.ContainsFunc(v.visibleIn(c.Topics, sent, *g.MissedThrough+1), func(s int64) bool { return !v.inDB[s] }) {
				return st, fmt.Errorf("pruned gap %s, but every event of the scope in its range is still in the log", g.String())
			}
			covered = [2]int64{*g.MissedFrom, *g.MissedThrough}
		default:
			return st, fmt.Errorf("gap reason %q for valid cursor %d ≤ head %d", reason, sent, head)
		}
	}

	prev, first := cursor, int64(0) // first: the first event delivered
	for i, f := range fs {
		switch f.kind {
		case 'e':
		case 'g':
			return st, fmt.Errorf("gap frame at position %d, after events", i)
		default:
			return st, fmt.Errorf("unexpected frame %q", f.data)
		}
		seq := f.seq
		if seq <= prev {
			return st, fmt.Errorf("event %d after %d: ids not strictly increasing", seq, prev)
		}
		en, ok := v.bySeq[seq]
		switch {
		case !ok:
			return st, fmt.Errorf("event %d was never published", seq)
		case !visible(c.Topics, en.topic):
			return st, fmt.Errorf("event %d of topic %q delivered to scope %q", seq, en.topic, c.Topics)
		case en.hash != f.hash:
			return st, fmt.Errorf("event %d: type or data differ from what was published", seq)
		}
		if g != nil && reason != reasonPruned && covered[0] <= covered[1] && seq <= covered[1] {
			return st, fmt.Errorf("event %d inside or below the gap's range %d..%d", seq, covered[0], covered[1])
		}
		for _, s := range v.visibleIn(c.Topics, prev, seq) {
			if s < covered[0] || s > covered[1] {
				return st, &holeError{seq: s, prev: prev, next: seq}
			}
			// Inside a pruned gap's range the replay window holds every
			// event the log kept from its first on (topics pruned apart
			// leave kept events there): one still in the log at the end
			// was kept, so it is a hole once the replay began.
			if reason == reasonPruned && prev > cursor && v.inDB[s] {
				return st, &holeError{seq: s, prev: prev, next: seq}
			}
		}
		if seq <= head {
			st.replayed++
		}
		if first == 0 {
			first = seq
		}
		st.events++
		prev = seq
	}
	if st.replayed > limit {
		return st, fmt.Errorf("%d events replayed, limit %d", st.replayed, limit)
	}
	if reason == reasonPruned && prev > head && st.replayed < limit && first > 0 {
		// The replay window W is the newest min(|V|, limit) events of V,
		// the scope's events above the cursor at the handshake; an event
		// still in the log at the end that precedes the replay was in V.
		// If it was not in W, every event of W is above it, and each was
		// either replayed or deleted during the replay at or below the
		// gap's range's end (a deletion above it, past what was written,
		// ends the stream). So with s the highest such event and D the
		// scope's events above s, in the range, gone at the end,
		// replayed+D < limit means |W| < limit: W was all of V, s in it,
		// and not replaying s is a hole. (Fewer replayed than the limit
		// alone proves nothing: W's events may be pruned mid-replay.)
		kept := int64(0)
		for _, s := range v.visibleIn(c.Topics, cursor, first) {
			if v.inDB[s] {
				kept = s
			}
		}
		if kept > 0 {
			gone := 0
			for _, s := range v.visibleIn(c.Topics, kept, covered[1]+1) {
				if !v.inDB[s] {
					gone++
				}
			}
			if st.replayed+gone < limit {
				return st, fmt.Errorf("event %d was kept inside the pruned gap's range but not replayed (%d replayed, %d of the scope above it in the range pruned, limit %d, first %d)", kept, st.replayed, gone, limit, first)
			}
		}
	}
	if reason == reasonReplayLimit && prev > head && st.replayed != limit {
		return st, fmt.Errorf("replay_limit gap but %d events replayed, limit %d", st.replayed, limit)
	}
	return st, nil
}

// holeError is the violation the guarantee forbids: an event visible to the scope,
// above the cursor, neither delivered nor named in a gap.
type holeError struct{ seq, prev, next int64 }

func (h *holeError) Error() string {
	return fmt.Sprintf("silent hole: event %d is visible, between delivered %d and %d, and in no gap", h.seq, h.prev, h.next)
}

// trace describes a violating connection: what it was, the frames around
// the violation, and what else happened meanwhile.
func (v *view) trace(c *Conn, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION (seed %d) conn %d of %s: hub %s, topics %q, mode %s, cursor %q via %s (from hub %q), %s; %v..%v, status %d, ended: %s\n  %v\n",
		v.in.Seed, c.ID, c.Client, c.Server.Name, c.Topics, c.Mode, c.Sent, c.Via, prevHub(c.After), c.Behaviour, c.Start.Round(time.Millisecond),
		c.Stop.Round(time.Millisecond), c.Status, c.End, err)
	focus := int64(-1)
	var hole *holeError
	if errors.As(err, &hole) {
		focus = hole.next
		en := v.bySeq[hole.seq]
		fmt.Fprintf(&b, "  missing event %d: topic %q, type %q, id %s, still in the log at the end: %v\n",
			hole.seq, en.topic, en.typ, en.eventID, v.inDB[hole.seq])
	}
	// The handshake frames and the events around the focus.
	idx := -1
	for i, f := range c.frames {
		if f.kind == 'e' && f.seq == focus {
			idx = i
		}
	}
	for i, f := range c.frames {
		near := idx >= 0 && i >= idx-5 && i <= idx+2
		if f.kind != 'e' || near || (idx < 0 && i < 12) {
			if f.kind == 'e' {
				en := v.bySeq[f.seq]
				fmt.Fprintf(&b, "  frame %d: event %d (topic %q)\n", i, f.seq, en.topic)
			} else {
				fmt.Fprintf(&b, "  frame %d: %c %s\n", i, f.kind, f.data)
			}
		}
	}
	fmt.Fprintf(&b, "  %d frames in all\n", len(c.frames))
	v.in.Timeline.write(&b, c.Start, c.Stop)
	return b.String()
}
