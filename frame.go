package replayd

import (
	"encoding/json"
	"strconv"
)

// SSE frames (PROTOCOL.md describes them) other than live delivery's: the
// event frame and its encoding are internal/live's (frame.go there).

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

// wireGap is the data of a gap frame, and a poll answer's gap: the wire
// type (Gap is the in-process one). Every key is always present; a range the
// server cannot name is null.
type wireGap struct {
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
