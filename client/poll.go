package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// pollAnswer is a poll's answer (PROTOCOL.md, "The poll transport").
type pollAnswer struct {
	Cursor *int64 `json:"cursor"`
	Head   *int64 `json:"head"`
	More   bool   `json:"more"`
	Gap    *Gap   `json:"gap"`
	Events []struct {
		ID    int64           `json:"id"`
		Type  string          `json:"type"`
		Topic *string         `json:"topic"`
		Data  json.RawMessage `json:"data"`
	} `json:"events"`
}

// pollSlack is how much longer than its wait a poll may take before it is
// given up as lost.
const pollSlack = 30 * time.Second

// poll makes one poll and hands its answer on. A fresh client (no cursor
// yet) and one owed more (now) ask without waiting; otherwise the poll is
// a long poll of PollWait.
func (c *Client) poll(ctx context.Context, handle func(Message) error, now bool) attempt {
	cursor := c.cursor.Load()
	wait := c.opts.PollWait
	if now || cursor < 0 {
		wait = 0
	}
	params := url.Values{}
	if cursor >= 0 {
		params.Set("cursor", strconv.FormatInt(cursor, 10))
	}
	if wait > 0 {
		params.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', -1, 64))
	}
	if c.opts.PollLimit > 0 {
		params.Set("limit", strconv.Itoa(c.opts.PollLimit))
	}
	rctx, cancel := context.WithTimeout(ctx, wait+pollSlack)
	defer cancel()
	req, err := c.newRequest(rctx, c.opts.Poll, params)
	if err != nil {
		return attempt{err: err}
	}
	start := time.Now()
	c.log.Debug("replayd client: poll", "cursor", cursor, "wait", wait)
	resp, err := c.http.Do(req)
	if err != nil {
		return attempt{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refused(resp)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPollBody+1))
	if err != nil {
		return attempt{err: err}
	}
	if len(body) > maxPollBody {
		return attempt{err: errStop{ErrFrameTooLarge}}
	}
	var ans pollAnswer
	if err := json.Unmarshal(body, &ans); err != nil || ans.Cursor == nil {
		return attempt{err: fmt.Errorf("replayd client: GET %s: not a poll answer: %.100q", bareURL(req.URL), body)}
	}
	if g := ans.Gap; g != nil {
		// A gap with a range moves the cursor past it, and only its part
		// above the cursor is news. An unknown_cursor or invalid_cursor
		// gap with no events moves it to the answer's cursor: the head of
		// the log being read, which may be below it.
		next := cursor
		if isReset(g) {
			if len(ans.Events) == 0 {
				next = *ans.Cursor
			}
		} else {
			top := int64(-1)
			if ans.Head != nil {
				top = *ans.Head
				for _, e := range ans.Events {
					top = max(top, e.ID)
				}
			}
			g, next = news(g, cursor, top)
		}
		if g == nil {
			c.log.Debug("replayd client: a gap at or below the cursor dropped", "cursor", cursor, "gap", ans.Gap)
		} else if err := c.accept(handle, Message{Gap: g}, next); err != nil {
			return attempt{err: err}
		}
	}
	for i := range ans.Events {
		e := &ans.Events[i]
		if e.ID <= c.cursor.Load() {
			continue // at most once
		}
		ev := &Event{ID: e.ID, Type: e.Type, Data: e.Data, HasTopic: true}
		if e.Topic != nil {
			ev.Topic = *e.Topic
		}
		if err := c.accept(handle, Message{Event: ev}, e.ID); err != nil {
			return attempt{err: err}
		}
	}
	// A fresh poll learns the head, where the client starts.
	if *ans.Cursor > c.cursor.Load() {
		c.cursor.Store(*ans.Cursor)
	}
	a := attempt{session: true}
	switch {
	case c.cursor.Load() != cursor:
		a.now = ans.More // progress: more is owed at once
	case ans.More || ans.Gap != nil || len(ans.Events) > 0:
		// More owed but none given, a gap or events that moved nothing (a
		// repeat): a server or proxy answering in a loop is backed off
		// from as from an error, until an answer moves the cursor again.
		a.stalled, a.err = true, errNoProgress
	case wait > 0 && time.Since(start) < time.Second:
		a.wait = time.Second // a server that does not hold polls is not asked in a loop
	}
	return a
}
