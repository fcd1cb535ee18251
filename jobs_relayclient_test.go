package replayd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"unicode/utf16"
)

// A client of the stream-relay wire protocol v2, written from its
// document (shared/seeds/stream-relay.md, "Wire protocol") and nothing
// else: what a client written for stream-relay sends and reads.

type relayStartAnswer struct {
	ProtocolVersion int    `json:"protocolVersion"`
	StreamID        string `json:"streamId"`
	StartedAt       int64  `json:"startedAt"`
}

type relayPollAnswer struct {
	ProtocolVersion int               `json:"protocolVersion"`
	StreamID        string            `json:"streamId"`
	Status          string            `json:"status"`
	Complete        bool              `json:"complete"`
	CompletedAt     *int64            `json:"completed_at"`
	Progress        *relayProgress    `json:"progress"`
	Append          string            `json:"append"`
	NextOffset      int64             `json:"nextOffset"`
	Events          []json.RawMessage `json:"events"`
	NextEventOffset int64             `json:"nextEventOffset"`
	LastEventAt     int64             `json:"lastEventAt"`
	ServerNow       int64             `json:"serverNow"`
	Final           *struct {
		Text   string            `json:"text"`
		Events []json.RawMessage `json:"events"`
		Meta   json.RawMessage   `json:"meta"`
	} `json:"final"`
	Error     string `json:"error"`
	ErrorInfo *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"errorInfo"`
	raw map[string]json.RawMessage
}

type relayProgress struct {
	Phase     string          `json:"phase"`
	Message   string          `json:"message"`
	Data      json.RawMessage `json:"data"`
	UpdatedAt int64           `json:"updated_at"`
}

type relayClient struct {
	t    testing.TB
	base string // the relay's URL; routes are base+"/streams"
}

func (c relayClient) start(ctx context.Context, streamID string, payload any) relayStartAnswer {
	c.t.Helper()
	body := map[string]any{}
	if streamID != "" {
		body["streamId"] = streamID
	}
	if payload != nil {
		body["payload"] = payload
	}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/streams", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		c.t.Fatalf("POST /streams: %d", resp.StatusCode)
	}
	var a relayStartAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		c.t.Fatal(err)
	}
	if a.ProtocolVersion != 2 || a.StreamID == "" || a.StartedAt == 0 {
		c.t.Fatalf("POST /streams answered %+v", a)
	}
	return a
}

// poll is one GET; an error is returned (not fatal) for a poll cut by ctx.
func (c relayClient) poll(ctx context.Context, id string, since, eventSince int64) (*relayPollAnswer, error) {
	u := fmt.Sprintf("%s/streams/%s?since=%d&eventSince=%d", c.base, url.PathEscape(id), since, eventSince)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var raw map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %d", u, resp.StatusCode)
	}
	b, _ := json.Marshal(raw)
	var a relayPollAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, err
	}
	a.raw = raw
	// Every answer carries the document's required fields.
	for _, f := range []string{"protocolVersion", "streamId", "status", "complete", "append", "nextOffset", "events", "nextEventOffset", "lastEventAt", "serverNow"} {
		if _, ok := raw[f]; !ok {
			c.t.Errorf("GET answer lacks %q: %s", f, b)
		}
	}
	if a.ProtocolVersion != 2 {
		c.t.Errorf("protocolVersion %d", a.ProtocolVersion)
	}
	// Offsets past the text are clamped to its length.
	if a.NextOffset-min(since, a.NextOffset) != int64(len(utf16.Encode([]rune(a.Append)))) && a.Status != "not_found" {
		c.t.Errorf("since %d, append %q (%d UTF-16 units), nextOffset %d", since, a.Append,
			len(utf16.Encode([]rune(a.Append))), a.NextOffset)
	}
	return &a, nil
}

// follower is a reader's state, as a page persists it across reloads.
type follower struct {
	text             string
	offset, evOffset int64
	events           []json.RawMessage
	last             *relayPollAnswer
}

// step polls once from the follower's offsets and takes what came.
func (f *follower) step(ctx context.Context, c relayClient, id string) error {
	a, err := c.poll(ctx, id, f.offset, f.evOffset)
	if err != nil {
		return err
	}
	f.text += a.Append
	f.offset, f.evOffset = a.NextOffset, a.NextEventOffset
	f.events = append(f.events, a.Events...)
	f.last = a
	return nil
}

func (f *follower) done() bool {
	return f.last != nil && f.last.Status != "streaming"
}
