package chaostest

// The oracle: the log against the ledger, every SSE connection against
// SPEC §1 and §4, the in-process subscribers.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// The gap reasons of SPEC §4.4 (PROTOCOL.md, "gap").
const (
	reasonReplayLimit   = "replay_limit"
	reasonPruned        = "pruned"
	reasonUnknownCursor = "unknown_cursor"
	reasonInvalidCursor = "invalid_cursor"
)

// parseCursor parses a cursor as SPEC §4.4 does: ASCII digits only, within
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
	bySeq map[int64]entry
	polls map[int64]uint64 // ledger.polled
	seqs  []int64          // ascending
	inDB  map[int64]bool
	mark  int64 // the highest prune watermark of any topic
}

func visible(scope []string, topic string) bool {
	return len(scope) == 0 || topic == "" || slices.Contains(scope, topic)
}

// deniedScope reports whether hub A's Authorize refuses topics: the global
// scope when it is denied, else any denied topic among them.
func (e *env) deniedScope(topics []string) bool {
	if len(topics) == 0 {
		return e.denied[""]
	}
	return slices.ContainsFunc(topics, func(t string) bool { return e.denied[t] })
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

// readLog reads, through a hub of its own, every event retained in the log
// and the global prune watermark: the end of the pruned gap a global poll
// from cursor 0 is owed (0 when none is).
func (e *env) readLog() (rows []replayd.Event, mark int64, err error) {
	h, closeHub, err := e.open(replayd.Options{})
	if err != nil {
		return nil, 0, fmt.Errorf("open a hub to read the log: %w", err)
	}
	defer closeHub()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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

// check verifies the log against the ledger, every connection
// against SPEC §1 and §4, and the in-process subscribers.
func (e *env) check(results []clientResult, subA, subB *subscriber, elapsed time.Duration) {
	t := e.t
	v := &view{bySeq: e.ledger.bySeq, polls: e.ledger.polled, inDB: map[int64]bool{}}
	for s := range v.bySeq {
		v.seqs = append(v.seqs, s)
	}
	slices.Sort(v.seqs)
	fence := e.fence.Load()

	// The log: every row is a ledger event, intact; every ledger
	// event missing from it was pruned; the head is the newest sequence.
	rows, mark, err := e.readLog()
	if err != nil {
		t.Fatal(err)
	}
	v.mark = mark
	for _, ev := range rows {
		en, ok := v.bySeq[ev.Sequence]
		switch {
		case !ok:
			t.Errorf("row %d (%s) is in the log but no Publish returned it", ev.Sequence, ev.EventID)
		case en != entry{topic: ev.Topic, typ: ev.Type, eventID: ev.EventID, hash: frameHash(ev.Type, string(ev.Payload))}:
			t.Errorf("row %d differs from what Publish returned", ev.Sequence)
		}
		v.inDB[ev.Sequence] = true
	}
	for _, s := range v.seqs {
		if !v.inDB[s] && s > v.mark {
			t.Errorf("event %d is neither in the log nor below the prune watermark %d", s, v.mark)
		}
	}
	for s := range e.ledger.renewed {
		if v.inDB[s] {
			t.Errorf("a retry of event %d's id stored a new row although %d is still in the log", s, s)
		}
	}
	head, err := e.hubA.LatestSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if head != v.seqs[len(v.seqs)-1] || head != fence {
		t.Errorf("head %d, newest published %d, fence %d", head, v.seqs[len(v.seqs)-1], fence)
	}

	// In-process subscribers: strictly increasing; every event above
	// their start that is still in the log (so was never pruned, so was
	// readable when the hub caught up) delivered.
	for name, s := range map[string]*subscriber{"A": subA, "B": subB} {
		s.mu.Lock()
		got := s.seqs
		s.mu.Unlock()
		delivered := map[int64]bool{}
		for i, seq := range got {
			if i > 0 && seq <= got[i-1] {
				t.Errorf("hub %s subscriber: %d after %d", name, seq, got[i-1])
			}
			delivered[seq] = true
		}
		for _, seq := range v.visibleIn(nil, s.start, fence+1) {
			if v.inDB[seq] && !delivered[seq] {
				t.Errorf("hub %s subscriber (from %d) never got event %d, which was never pruned", name, s.start, seq)
			}
		}
	}

	// Every connection.
	var conns, frames, events, replayed, detached int
	gaps := map[string]int{}
	modes := map[string]int{}
	ends := map[string]int{}
	var violations []string
	for ci, r := range results {
		if !r.reachedFence {
			msg := fmt.Sprintf("client %d never reached the fence %d", ci, fence)
			if n := len(r.conns); n > 0 {
				msg += "; its last connection:\n" + e.trace(v, r.conns[n-1], errors.New("stuck"))
			}
			t.Errorf("%s", msg)
		}
		for _, c := range r.conns {
			if c.status != http.StatusOK {
				continue
			}
			if c.overloaded {
				if _, err := e.checkConn(v, c, head); err != nil {
					violations = append(violations, e.trace(v, c, err))
				}
				continue
			}
			conns++
			modes[c.mode]++
			ends[strings.TrimRight(strings.SplitN(strings.SplitN(c.end, " (", 2)[0], " frames", 2)[0], " 0123456789")]++
			frames += len(c.frames) + c.heartbeats
			st, err := e.checkConn(v, c, head)
			events += st.events
			replayed += st.replayed
			if st.detached {
				detached++
			}
			if st.gap != "" {
				gaps[st.gap]++
			}
			if err != nil {
				violations = append(violations, e.trace(v, c, err))
			}
		}
	}
	violations = append(violations, e.checkPolls(v, head)...)
	for i, msg := range violations {
		if i == 8 {
			t.Errorf("... and %d more violations", len(violations)-i)
			break
		}
		t.Errorf("%s", msg)
	}

	t.Logf("chaos phase and finish: %v", elapsed.Round(time.Millisecond))
	t.Logf("published %d events (%d publish calls, %d through hub B; %d retries with a used event id: %d returned the original, %d a new row after the original was pruned); %d still in the log; prune watermark %d",
		len(v.seqs), e.stats.publishes.Load(), e.stats.publishB.Load(), e.stats.retries.Load(),
		e.stats.retriesSame.Load(), e.stats.retriesNew.Load(), len(rows), v.mark)
	t.Logf("%d prune calls deleted %d rows; hub B restarted %d times; hub A disconnected all streams %d times, its listener closed all connections %d times",
		e.stats.pruneCalls.Load(), e.stats.pruned.Load(), e.stats.restarts.Load(), e.stats.resyncs.Load(), e.stats.kills.Load())
	t.Logf("checked %d connections (%d frames, %d events of which %d replayed; %d streams served detached): modes %v; gaps %v; ends %v; %d more dropped before any response",
		conns, frames, events, replayed, detached, modes, gaps, ends, e.stats.dropped.Load())
	t.Logf("hub A refused %d requests by Authorize and %d by MaxConnections; %d connections retried after the overload answer were served",
		e.stats.forbidden.Load(), e.stats.overloaded.Load(), e.stats.servedAfterOverload.Load())
	if len(violations) > 0 {
		t.Errorf("%d connections violated the guarantee; seed %d", len(violations), e.seed)
	}
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
//     scope was delivered or lies in the gap's range: no silent hole;
//   - the replay (ids up to the hello's head) is at most the replay
//     limit, all of it when a replay_limit gap was sent, and newer than
//     the gap's range.
func (e *env) checkConn(v *view, c *sseConn, finalHead int64) (st connStats, err error) {
	fs := c.frames
	limit := e.limitA
	if c.hub == "B" {
		limit = e.limitB
	}
	if c.hub == "A" && e.deniedScope(c.topics) && !c.overloaded {
		// The cap is checked before Authorize: a denied scope may get the
		// overload answer, never a stream.
		return st, fmt.Errorf("served a scope Authorize denies")
	}
	if c.overloaded {
		ms, err := strconv.ParseInt(fs[0].data, 10, 64)
		if lo := e.overloadRetry.Milliseconds(); err != nil || ms < lo || ms > 2*lo {
			return st, fmt.Errorf("overload answer retry %q outside [%d, %d] ms", fs[0].data, lo, 2*lo)
		}
		return st, nil
	}
	if c.hub == "A" && len(fs) > 0 {
		if fs[0].kind != 'r' || fs[0].data != "1000" {
			return st, fmt.Errorf("first frame is not retry: 1000")
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
	detach := e.optsA.SSE.DetachConnections
	if c.hub == "B" {
		detach = e.optsB.SSE.DetachConnections
	}
	if c.chunked == detach {
		return st, fmt.Errorf("stream chunked %v on a hub with DetachConnections %v", c.chunked, detach)
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
	case (hello.Topic == nil) != (len(c.topics) != 1) || (hello.Topic != nil && *hello.Topic != c.topics[0]):
		return st, fmt.Errorf("hello topic %v, connection topics %q", hello.Topic, c.topics)
	case hello.Topics == nil || len(*hello.Topics) != len(c.topics) || (len(c.topics) > 0 && !slices.Equal(*hello.Topics, c.topics)):
		return st, fmt.Errorf("hello topics %v, connection topics %q", hello.Topics, c.topics)
	case head < 0 || head > finalHead:
		// The head need not be a stored event: a rejected duplicate may
		// consume a sequence (SPEC §2).
		return st, fmt.Errorf("hello head %d is outside 0..%d", head, finalHead)
	}
	fs = fs[1:]

	// What the cursor calls for.
	sent, valid := int64(0), false
	if c.sent != "" {
		sent, valid = parseCursor(c.sent)
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
	case c.sent == "":
		if g != nil || cursor != head {
			return st, fmt.Errorf("fresh connection: cursor %d, head %d, gap %q", cursor, head, reason)
		}
	case !valid:
		if reason != reasonInvalidCursor || g.ResumedFrom != nil || g.MissedFrom != nil || g.MissedThrough != nil || g.Missed != nil || cursor != head {
			return st, fmt.Errorf("invalid cursor %q: cursor %d, head %d, gap %+v", c.sent, cursor, head, g)
		}
	case sent > head:
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
			n := int64(len(v.visibleIn(c.topics, from-1, through+1)))
			if from <= sent || through < from || through > head || missed < 1 || missed > n ||
				!visible(c.topics, v.bySeq[from].topic) || !visible(c.topics, v.bySeq[through].topic) {
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
			if !slices.ContainsFunc(v.visibleIn(c.topics, sent, *g.MissedThrough+1), func(s int64) bool { return !v.inDB[s] }) {
				return st, fmt.Errorf("pruned gap %s, but every event of the scope in its range is still in the log", g.String())
			}
			covered = [2]int64{*g.MissedFrom, *g.MissedThrough}
		default:
			return st, fmt.Errorf("gap reason %q for valid cursor %d ≤ head %d", reason, sent, head)
		}
	}

	prev := cursor
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
		case !visible(c.topics, en.topic):
			return st, fmt.Errorf("event %d of topic %q delivered to scope %q", seq, en.topic, c.topics)
		case en.hash != f.hash:
			return st, fmt.Errorf("event %d: type or data differ from what was published", seq)
		}
		if g != nil && covered[0] <= covered[1] && seq <= covered[1] {
			return st, fmt.Errorf("event %d inside or below the gap's range %d..%d", seq, covered[0], covered[1])
		}
		for _, s := range v.visibleIn(c.topics, prev, seq) {
			if s < covered[0] || s > covered[1] {
				return st, &holeError{seq: s, prev: prev, next: seq}
			}
		}
		if seq <= head {
			st.replayed++
		}
		st.events++
		prev = seq
	}
	if st.replayed > limit {
		return st, fmt.Errorf("%d events replayed, limit %d", st.replayed, limit)
	}
	if reason == reasonReplayLimit && prev > head && st.replayed != limit {
		return st, fmt.Errorf("replay_limit gap but %d events replayed, limit %d", st.replayed, limit)
	}
	return st, nil
}

// holeError is the violation §1 forbids: an event visible to the scope,
// above the cursor, neither delivered nor named in a gap.
type holeError struct{ seq, prev, next int64 }

func (h *holeError) Error() string {
	return fmt.Sprintf("silent hole: event %d is visible, between delivered %d and %d, and in no gap", h.seq, h.prev, h.next)
}

// trace describes a violating connection: what it was, the frames around
// the violation, and what else happened meanwhile.
func (e *env) trace(v *view, c *sseConn, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION (seed %d) conn %d of client %d: hub %s, topics %q, mode %s, cursor %q via %s, %s; %v..%v, ended: %s\n  %v\n",
		e.seed, c.id, c.client, c.hub, c.topics, c.mode, c.sent, c.via, c.behaviour, c.start.Round(time.Millisecond),
		c.stop.Round(time.Millisecond), c.end, err)
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
	e.timeline.write(&b, c.start, c.stop)
	return b.String()
}
