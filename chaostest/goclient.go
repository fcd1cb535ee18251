package chaostest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
)

// Go clients (package client): next to the raw SSE and poll clients, a few
// clients of the package, one per transport (SSE, long polls, auto), each
// on one hub with one scope, that run until the fence, each Run stopped
// now and then and a new client started from the last one's Cursor, as an
// application that persists the cursor and restarts does. What each Run
// handed its handler is checked by the oracle (checkClientRun).

const numGoClients = 3

// ClientRun is the record of one Run of a Go client: the scope, the cursor
// it started from, and every message it handed, in order.
type ClientRun struct {
	Server    *Server
	Topics    []string
	Transport client.Transport
	Start     int64            // Options.Cursor
	Messages  []client.Message // what the handler was handed, in order
	Cursor    int64            // Cursor when Run returned
	End       string           // what Run returned

	// For traces only.
	ID     int
	Client string
}

// errFence stops a Go client's Run at the fence.
var errFence = errors.New("reached the fence")

// goClient runs Go clients one after the other from one cursor until one
// reaches the fence (or the finish deadline passes).
func (e *env) goClient(idx int, rng *rand.Rand) (runs []*ClientRun, reached bool) {
	hub := "A"
	if rng.IntN(3) == 0 {
		hub = "B"
	}
	scope := drawScope(rng)
	for range 100 {
		if hub == "B" || !e.deniedScope(scope) {
			break
		}
		scope = drawScope(rng)
	}
	if hub == "A" && e.deniedScope(scope) {
		hub = "B"
	}
	transport := []client.Transport{client.SSE, client.Poll, client.Auto}[idx%3]
	cursor := int64(0)
	logs := &wiretest.LogRecorder{}
	for {
		select {
		case <-e.finishDeadline:
			lines := strings.Split(logs.String(), "\n")
			e.t.Errorf("go client %d (%s) on hub %s, topics %q, at cursor %d: the fence not reached; its last reconnects:\n%s",
				idx, transport, hub, scope, cursor, strings.Join(lines[max(0, len(lines)-12):], "\n"))
			return runs, false
		default:
		}
		run := &ClientRun{Server: e.server(hub), Topics: scope, Transport: transport, Start: cursor,
			ID: int(e.connSeq.Add(1)), Client: fmt.Sprintf("go client %d (%s)", idx, transport)}
		runs = append(runs, run)
		ctx, cancel := context.WithCancel(context.Background())
		if !finishing(e.finish) {
			time.AfterFunc(time.Duration(200+rng.IntN(2000))*time.Millisecond, cancel)
		}
		done := make(chan struct{})
		go func() {
			select {
			case <-e.finishDeadline:
				cancel()
			case <-done:
			}
		}()
		c := client.New(client.Options{
			SSE: e.url(hub, "/events", nil), Poll: e.url(hub, "/poll", nil), Transport: transport, Topics: scope,
			Cursor: cursor, HTTPClient: e.httpc, Logger: slog.New(logs),
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, PollWait: time.Second,
		})
		err := c.Run(ctx, func(m client.Message) error {
			run.Messages = append(run.Messages, m)
			// The fence, or a gap naming it (a hub that replays nothing
			// skips it when it was committed before the handshake). The
			// fence is known by its type too: live delivery can hand it
			// to a client before its Publish returns and e.fence is set.
			fence := e.fence.Load()
			if m.Event != nil && m.Event.Type == "fence" || fence > 0 && (m.Event != nil && m.Event.ID >= fence ||
				m.Gap != nil && m.Gap.MissedThrough != nil && *m.Gap.MissedThrough >= fence) {
				return errFence
			}
			return nil
		})
		close(done)
		cancel()
		run.Cursor, run.End = c.Cursor(), fmt.Sprint(err)
		cursor = c.Cursor()
		switch {
		case errors.Is(err, errFence):
			return runs, true
		case errors.Is(err, context.Canceled):
		default:
			e.t.Errorf("%s on hub %s, topics %q: Run returned %v", run.Client, hub, scope, err)
			return runs, false
		}
	}
}

// checkClientRuns checks every Run of the Go clients against the client's promise: ids
// strictly increasing from the cursor it started at; every event a
// published one of the scope, with its type and data (and topic, over
// polls); every visible event between two it handed (or between its start
// and the first) handed, or inside the range of a gap it handed in
// between; the cursor at the end the last event handed (or beyond, at a
// poll answer's cursor).
func (v *view) checkClientRuns(runs []*ClientRun) {
	for _, run := range runs {
		v.r.ClientRuns++
		if err := v.checkClientRun(run); err != nil {
			v.r.Violations = append(v.r.Violations, v.traceClientRun(run, err))
		}
	}
}

func (v *view) checkClientRun(run *ClientRun) error {
	prev := run.Start
	var gaps [][2]int64 // ranges of the gaps handed since the last event
	for _, m := range run.Messages {
		if g := m.Gap; g != nil {
			v.r.ClientGaps[g.Reason]++
			if g.Reason != reasonPruned && g.Reason != reasonReplayLimit {
				return fmt.Errorf("gap %q on the log that issued the cursor", g.Reason)
			}
			if g.MissedFrom == nil || g.MissedThrough == nil || *g.MissedFrom > *g.MissedThrough || *g.MissedFrom <= prev {
				return fmt.Errorf("gap %s with a range not above the cursor %d", gapString(g), prev)
			}
			gaps = append(gaps, [2]int64{*g.MissedFrom, *g.MissedThrough})
			continue
		}
		ev := m.Event
		if ev == nil {
			return errors.New("a message with neither event nor gap")
		}
		v.r.ClientEvents++
		en, ok := v.bySeq[ev.ID]
		want := en.hash
		if ev.HasTopic {
			want = en.polled
		}
		switch {
		case ev.ID <= prev:
			return fmt.Errorf("event %d after %d: ids not strictly increasing", ev.ID, prev)
		case !ok:
			return fmt.Errorf("event %d was never published", ev.ID)
		case !visible(run.Topics, en.topic):
			return fmt.Errorf("event %d of topic %q handed to scope %q", ev.ID, en.topic, run.Topics)
		case ev.HasTopic && ev.Topic != en.topic:
			return fmt.Errorf("event %d: topic %q, published on %q", ev.ID, ev.Topic, en.topic)
		case frameHash(ev.Type, string(ev.Data)) != want:
			return fmt.Errorf("event %d: type or data differ from what was published", ev.ID)
		}
		for _, s := range v.visibleIn(run.Topics, prev, ev.ID) {
			if !slices.ContainsFunc(gaps, func(g [2]int64) bool { return g[0] <= s && s <= g[1] }) {
				return &holeError{seq: s, prev: prev, next: ev.ID}
			}
		}
		prev, gaps = ev.ID, nil
	}
	if run.Cursor < prev && run.End != errFence.Error() { // the fence is refused, so not accepted
		return fmt.Errorf("Cursor %d at the end, below the last event handed, %d", run.Cursor, prev)
	}
	return nil
}

func gapString(g *client.Gap) string {
	f := func(p *int64) string {
		if p == nil {
			return "null"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("{%s resumedFrom %s missed %s..%s (%s) limit %d}", g.Reason, f(g.ResumedFrom), f(g.MissedFrom), f(g.MissedThrough), f(g.Missed), g.ReplayLimit)
}

// traceClientRun describes a violating Run.
func (v *view) traceClientRun(run *ClientRun, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION (seed %d) run %d of %s: hub %s, topics %q, from cursor %d, ended at %d: %s\n  %v\n",
		v.in.Seed, run.ID, run.Client, run.Server.Name, run.Topics, run.Start, run.Cursor, run.End, err)
	for i, m := range run.Messages {
		if i == 60 {
			fmt.Fprintf(&b, "  ... %d messages in all\n", len(run.Messages))
			break
		}
		if m.Gap != nil {
			fmt.Fprintf(&b, "  gap %s\n", gapString(m.Gap))
		} else if m.Event != nil {
			fmt.Fprintf(&b, "  event %d (topic %q)\n", m.Event.ID, v.bySeq[m.Event.ID].topic)
		}
	}
	return b.String()
}
