package jobs

import (
	"encoding/json"
	"fmt"
)

// Status is a job's lifecycle state. Streaming is followed by exactly one
// of Complete and Error.
type Status string

const (
	Streaming Status = "streaming"
	Complete  Status = "complete"
	Error     Status = "error"
)

// Error codes of a job that ended Error (ErrorInfo.Code).
const (
	CodeFailed      = "failed"      // the upstream returned an error
	CodePanicked    = "panicked"    // the upstream panicked
	CodeAbandoned   = "abandoned"   // nobody read the job for AbandonAfter
	CodeInterrupted = "interrupted" // the node running it stopped (its lease lapsed)
)

// ErrorInfo says why a job ended Error.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// record is a job's state, kept in its stream's record (AppStream.App) and
// written in the same transaction as the job's messages.
type record struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	// Owner is the node running the job (while Streaming); Lease is when
	// its claim lapses (Unix ms) unless it renews it.
	Owner string `json:"owner,omitempty"`
	Lease int64  `json:"lease,omitempty"`
	// Created, Updated (the upstream's last sign of life: a flush or a
	// heartbeat), LastRead (a reader's last poll, as other nodes report
	// it) and Completed, in Unix ms.
	Created   int64 `json:"created"`
	Updated   int64 `json:"updated"`
	LastRead  int64 `json:"lastRead,omitempty"`
	Completed int64 `json:"completed,omitempty"`
	// Text is the length of the job's committed text in UTF-16 code
	// units; Events the number of its committed events.
	Text     int64           `json:"text"`
	Events   int64           `json:"events"`
	Progress json.RawMessage `json:"progress,omitempty"`
	Meta     json.RawMessage `json:"meta,omitempty"`
	Err      *ErrorInfo      `json:"error,omitempty"`
	// Marks index the stream (index.go): positions of the log where a
	// read from a text and an event offset may start; MarkStep is the
	// distance between them.
	Marks    []mark `json:"marks,omitempty"`
	MarkStep int64  `json:"markStep,omitempty"`
}

func decodeRecord(app json.RawMessage) (*record, error) {
	var r record
	if err := json.Unmarshal(app, &r); err != nil || r.Status == "" {
		return nil, fmt.Errorf("replayd: jobs: not a job's record: %q", truncate(app))
	}
	return &r, nil
}

func truncate(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

func (r *record) encode() json.RawMessage {
	b, _ := json.Marshal(r) // plain fields: cannot fail
	return b
}

// Messages of a job's stream: one JSON object per event of the log, of
// one of these kinds.
const (
	kindText  = "text"  // {"k":"text","o":<UTF-16 offset>,"t":<text>}
	kindEvent = "event" // {"k":"event","n":<index>,"e":<event>}
	kindEnd   = "end"   // {"k":"end","status":...,"meta":...,"error":...}: the last message
	// {"k":"progress","p":<progress>}: the job's progress snapshot, once
	// per commit in which it changed (the record keeps the latest too), so
	// that a reader of the log follows it as well
	kindProgress = "progress"
)

// message is one message of a job's stream.
type message struct {
	K      string          `json:"k"`
	O      *int64          `json:"o,omitempty"`
	T      string          `json:"t,omitempty"`
	N      *int64          `json:"n,omitempty"`
	E      json.RawMessage `json:"e,omitempty"`
	P      json.RawMessage `json:"p,omitempty"`
	Status Status          `json:"status,omitempty"`
	Meta   json.RawMessage `json:"meta,omitempty"`
	Err    *ErrorInfo      `json:"error,omitempty"`
}

func (m message) encode() json.RawMessage {
	b, _ := json.Marshal(m)
	return b
}
