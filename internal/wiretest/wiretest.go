// Package wiretest is what replayd's tests share (the root package's
// tests, hubtest, chaostest) that does not need package replayd itself, so
// that the root's internal tests can use it too: the wire as the tests read
// it, independent of the types that write it, and the clients and
// recorders they assert with.
//
//   - Frame and ReadFrames: SSE frames, copied out of the shared parser
//     (internal/sseparse), refusing any field replayd never writes; Gap and
//     ParseGap: a gap's data, which must have all six keys of PROTOCOL.md.
//   - Client (client.go): an SSE stream read the way an EventSource does,
//     with Dial, Next, NextIs, Hello, Events, Quiet and Ended.
//   - Do, Get, GetReady, ServePoll, GetPoll, Poll, PollLater and
//     StalledConn (http.go): requests over real HTTP.
//   - WaitUntil, LogRecorder, Recorder and Seqs (record.go): bounded waits
//     and what a logger or a subscriber was told.
//   - PeakHeap and GetLargePoll (heap.go): the most heap a piece of work
//     held, and poll answers counted rather than kept.
//
// It must not import package replayd: an internal test of package replayd
// cannot import a package that does.
package wiretest

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/replayd/replayd/internal/sseparse"
)

// Frame is one SSE frame.
type Frame struct {
	ID    string
	HasID bool
	Event string // "" means "message", as in an EventSource
	Data  string
	Retry string
}

// ReadFrames parses an SSE stream into frames, sending each to out, until
// it ends; it returns what ended it (io.EOF for a clean end). Comments are
// skipped; a frame is dispatched at a blank line; a field replayd never
// writes is an error.
func ReadFrames(r io.Reader, out chan<- Frame) error {
	sr := sseparse.NewReaderSize(r, 64<<10)
	sr.Field = func(name, value []byte) error {
		switch string(name) {
		case "id", "event", "data", "retry":
			return nil
		}
		return fmt.Errorf("unknown SSE field %q with value %q", name, value)
	}
	for {
		f, err := sr.Next()
		if err != nil {
			return err
		}
		out <- Frame{ID: string(f.ID), HasID: f.HasID, Event: string(f.Event), Data: string(f.Data), Retry: string(f.Retry)}
	}
}

// Gap is a gap's data, with nulls kept as nil.
type Gap struct {
	Reason        string `json:"reason"`
	ResumedFrom   *int64 `json:"resumedFrom"`
	MissedFrom    *int64 `json:"missedFrom"`
	MissedThrough *int64 `json:"missedThrough"`
	Missed        *int64 `json:"missed"`
	ReplayLimit   int    `json:"replayLimit"`
}

// ParseGap parses a gap's data: a JSON object with the six keys of Gap and
// no other.
func ParseGap(data string) (Gap, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &keys); err != nil {
		return Gap{}, fmt.Errorf("gap data %q: %v", data, err)
	}
	for _, k := range []string{"reason", "resumedFrom", "missedFrom", "missedThrough", "missed", "replayLimit"} {
		if _, ok := keys[k]; !ok {
			return Gap{}, fmt.Errorf("gap %s lacks key %q", data, k)
		}
	}
	if len(keys) != 6 {
		return Gap{}, fmt.Errorf("gap %s has %d keys, want 6", data, len(keys))
	}
	var g Gap
	err := json.Unmarshal([]byte(data), &g)
	return g, err
}

// String is g as JSON, for messages.
func (g Gap) String() string {
	b, _ := json.Marshal(g)
	return string(b)
}
