package replayd

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// SSE frames (PROTOCOL.md describes them). Every frame ends with a blank line; field
// values never hold CR or LF, because Publish rejects them in types and the
// data is split into one "data:" line per payload line.

// appendEventFrame appends "id: <seq>\nevent: <type>\ndata: <payload>\n\n".
func appendEventFrame(b []byte, ev Event) []byte {
	b = append(b, "id: "...)
	b = strconv.AppendInt(b, ev.Sequence, 10)
	b = append(b, '\n')
	return appendFrame(b, ev.Type, ev.Payload)
}

// appendFrame appends an event frame without an id line.
func appendFrame(b []byte, eventType string, data []byte) []byte {
	b = append(b, "event: "...)
	b = append(b, eventType...)
	b = append(b, '\n')
	return append(appendData(b, data), '\n')
}

// appendData writes data as one "data:" line per line. CR, LF and CRLF
// each end a line, as they do for an SSE parser, so an EventSource
// reassembles data joined by LF: byte for byte when data's line breaks are
// LF, and JSON's insignificant CR whitespace comes back as LF.
func appendData(b, data []byte) []byte {
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			b = append(b, "data: "...)
			b = append(b, data...)
			return append(b, '\n')
		}
		b = append(b, "data: "...)
		b = append(b, data[:i]...)
		b = append(b, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
}

// appendRetry appends the field "retry: <ms>\n", to begin the block of the
// frame that follows: a block holding only retry reaches the applications
// of r3labs/sse and go-sse as an empty event.
func appendRetry(b []byte, ms int64) []byte {
	b = append(b, "retry: "...)
	b = strconv.AppendInt(b, ms, 10)
	return append(b, '\n')
}

// hello is the first frame of every stream; its id is the stream's cursor.
type hello struct {
	Topic  *string  `json:"topic"`  // the single topic; null for none or several
	Topics []string `json:"topics"` // in request order; [] for a global connection
	Cursor int64    `json:"cursor"`
	Head   int64    `json:"head"`
}

// Gap reasons.
const (
	reasonReplayLimit   = "replay_limit"
	reasonPruned        = "pruned"
	reasonUnknownCursor = "unknown_cursor"
	reasonInvalidCursor = "invalid_cursor"
)

// gap is the data of a gap frame. Every key is always present; a range the
// server cannot name is null.
type gap struct {
	Reason        string `json:"reason"`
	ResumedFrom   *int64 `json:"resumedFrom"`
	MissedFrom    *int64 `json:"missedFrom"`
	MissedThrough *int64 `json:"missedThrough"`
	Missed        *int64 `json:"missed"`
	ReplayLimit   int    `json:"replayLimit"`
}

func ptr[T any](v T) *T { return &v }

// heartbeatData returns the data of a heartbeat frame: {"t": unix ms},
// merged with extra when it is a JSON object, or with extra under "data".
func heartbeatData(ms int64, extra any) ([]byte, error) {
	t := strconv.AppendInt([]byte(`{"t":`), ms, 10)
	if extra == nil {
		return append(t, '}'), nil
	}
	raw, err := json.Marshal(extra)
	if err != nil {
		return append(t, '}'), err
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		return append(append(append(t, `,"data":`...), raw...), '}'), nil
	}
	obj["t"] = json.RawMessage(t[len(`{"t":`):])
	return json.Marshal(obj)
}
