package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// JobOptions configure a Job follower. Job (or Topic) is required, and a
// URL in Options.
type JobOptions struct {
	// Options reach the server, as for New: SSE and/or Poll, Transport,
	// Header, HTTPClient, Logger, backoff, PollWait. Its Topics and
	// Cursor are not used: the scope is the job's topic, the cursor the
	// state's.
	Options
	// Job is the job's id. Its topic is Prefix + Job; Prefix is the
	// server's JobsOptions.TopicPrefix, default "jobs/". Topic, when set,
	// is the topic instead.
	Job, Prefix, Topic string
	// State is where to continue from: a state saved from a Job's State
	// (say by an earlier process). nil: the job's beginning.
	State *JobState
}

// JobState is what a Job has of a job: everything it applied, and the
// cursor after it. Persist it (it encodes to JSON) and pass it back as
// JobOptions.State to go on exactly where this follower stopped: nothing
// lost, nothing twice.
type JobState struct {
	// Cursor is the id of the last message of the job's topic applied.
	Cursor int64 `json:"cursor"`
	// Text is the job's text so far, Next the UTF-16 offset (as the job
	// counts) its next chunk starts at: Text's length in UTF-16 code units
	// plus the holes' (TextMissing gaps), which are not padded.
	Text string `json:"text"`
	Next int64  `json:"next"`
	// Events are the job's structured events so far, by number (nil, or
	// JSON null once stored, for one named missing by an EventsMissing
	// gap).
	Events []json.RawMessage `json:"events"`
	// Progress is the latest progress snapshot ({phase?, message?,
	// data?, updated_at}), nil before the first.
	Progress json.RawMessage `json:"progress,omitempty"`
	// Gaps are what was missed, in the order it was noticed.
	Gaps []JobGap `json:"gaps,omitempty"`
	// End is the job's end, nil while it runs.
	End *JobEnd `json:"end,omitempty"`
}

func (s *JobState) clone() JobState {
	c := *s
	c.Events = slices.Clone(s.Events)
	c.Gaps = slices.Clone(s.Gaps)
	return c
}

// Reasons of the gaps a Job names itself (JobGap.Reason); any other reason
// is the server's (JobGap.Log).
const (
	// TextMissing: text from UTF-16 offset From to To was never received
	// (the next chunk started past the text held); the text goes on
	// after the hole.
	TextMissing = "text_missing"
	// EventsMissing: events numbered From to To-1 were never received.
	EventsMissing = "events_missing"
)

// JobGap names a part of the job the follower will not have: a hole in
// the text or the events, or a gap of the log (its events were pruned,
// say).
type JobGap struct {
	Reason string `json:"reason"`
	// From and To are the range [From, To) of a TextMissing (UTF-16
	// offsets) or EventsMissing gap (event numbers).
	From int64 `json:"from,omitempty"`
	To   int64 `json:"to,omitempty"`
	Log  *Gap  `json:"log,omitempty"` // the server's gap, for the other reasons
}

// JobEnd is how a job ended: Status "complete" with its final metadata
// (Meta, JSON; null when the upstream gave none), or "error" with Error.
type JobEnd struct {
	Status string          `json:"status"`
	Meta   json.RawMessage `json:"meta,omitempty"`
	Error  *JobError       `json:"error,omitempty"`
}

// Err is the end's error: nil for a job that completed, else *JobError.
func (e *JobEnd) Err() error {
	if e.Status == "complete" {
		return nil
	}
	if e.Error == nil {
		return &JobError{Code: e.Status}
	}
	return e.Error
}

// JobError says why a job ended "error". Code is one of "failed" (the
// upstream returned an error), "panicked", "abandoned" (nobody read the
// job for the server's AbandonAfter) and "interrupted" (the node running
// it stopped), as replayd.JobErrorInfo.
type JobError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *JobError) Error() string {
	return fmt.Sprintf("replayd client: job ended %s: %s", e.Code, e.Message)
}

// JobUpdate is what Run hands its handler: exactly one field is set.
type JobUpdate struct {
	// Text is a new piece of the text: Chunk, at UTF-16 offset Offset.
	// It is never text already held (a chunk replayed over text held is
	// cut to its new part, or dropped).
	Text *JobText
	// Event is structured event number N, each once, in emit order.
	Event *JobEvent
	// Progress is the new progress snapshot.
	Progress json.RawMessage
	// Gap names what the follower will not have.
	Gap *JobGap
	// End is the job's end: the last update.
	End *JobEnd
}

// JobText is a piece of a job's text.
type JobText struct {
	Chunk  string
	Offset int64 // where Chunk starts, in UTF-16 code units
}

// JobEvent is a structured event of a job.
type JobEvent struct {
	N    int64 // its number, from 0, in emit order
	Data json.RawMessage
}

// Job follows one job stream (docs/jobs.md) through a Client: it decodes
// the messages of the job's topic into its text (rebuilt by offset,
// nothing twice), its events (each once, in order, by number), its latest
// progress and its end. Create it with NewJob and follow with Run; State
// may be called at any time from any goroutine.
type Job struct {
	opts  JobOptions
	topic string

	running atomic.Bool // a Run is under way

	mu   sync.Mutex // guards st and text
	st   JobState   // st.Text is stale; text holds the text
	text strings.Builder
}

// NewJob returns a follower of the job opts names. It does not connect:
// Run does.
func NewJob(opts JobOptions) *Job {
	j := &Job{opts: opts, topic: opts.Topic}
	if j.topic == "" {
		p := opts.Prefix
		if p == "" {
			p = "jobs/"
		}
		j.topic = p + opts.Job
	}
	if opts.State != nil {
		j.st = opts.State.clone()
		j.text.WriteString(j.st.Text)
	}
	return j
}

// Topic is the topic the job is read from.
func (j *Job) Topic() string { return j.topic }

// State returns a copy of what the follower has of the job. Called from
// Run's handler, it includes the update being handled.
func (j *Job) State() JobState {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.st.clone()
	s.Text = j.text.String()
	return s
}

// Text returns the job's text so far.
func (j *Job) Text() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.text.String()
}

// errJobEnded and errToPolls end a Client's Run from the follower's
// handler.
var (
	errJobEnded = errors.New("replayd client: the job ended")
	errToPolls  = errors.New("replayd client: more missed than the SSE endpoint replays")
)

// Run follows the job until its end, and returns it: a job that ended
// "error" is a *JobEnd like any other (its Err is the *JobError), not an
// error of Run. handle (nil: none) gets every update, in order, on the
// calling goroutine; the state already includes it (State), and an error
// it returns undoes it and ends Run with that error, so that a later Run
// hands the update again. Run's other errors are the Client's: ctx.Err()
// when ctx ends, a *StatusError, the Header hook's. It reconnects by
// itself meanwhile, on the transports the options name; over SSE, a
// replay_limit gap (more missed than the server's SSE replay limit: not
// a loss) switches to polls when Options.Poll is given, which read the
// rest from the cursor with no gap, and is handed on as a gap otherwise.
// A job that does not exist (not started yet, or deleted after its
// retention) has no messages: Run waits for them until ctx ends. A state
// that holds the end returns it at once, without connecting.
//
// A Job runs one Run at a time; a later Run goes on from the state.
func (j *Job) Run(ctx context.Context, handle func(JobUpdate) error) (*JobEnd, error) {
	if !j.running.CompareAndSwap(false, true) {
		return nil, errors.New("replayd client: Job.Run called while another Run is running")
	}
	defer j.running.Store(false)
	if handle == nil {
		handle = func(JobUpdate) error { return nil }
	}
	transport := j.opts.Transport
	for {
		if end := j.end(); end != nil {
			return end, nil
		}
		o := j.opts.Options
		o.Topics, o.Cursor, o.Transport = []string{j.topic}, j.cursor(), transport
		c := New(o)
		polls := c.transport != Poll && o.Poll != ""
		err := c.Run(ctx, func(m Message) error { return j.message(c, m, polls, handle) })
		switch {
		case errors.Is(err, errJobEnded):
			return j.end(), nil
		case errors.Is(err, errToPolls):
			transport = Poll
		default:
			j.mu.Lock()
			j.st.Cursor = c.Cursor() // past a gap last accepted
			j.mu.Unlock()
			return nil, err
		}
	}
}

// end is a copy of the state's end, nil while the job runs.
func (j *Job) end() *JobEnd {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.st.End == nil {
		return nil
	}
	e := *j.st.End
	return &e
}

func (j *Job) cursor() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.st.Cursor
}

// jobMessage is a message of a job's topic (docs/jobs.md; the server's is
// internal/jobs/record.go): {"k":"text","o":O,"t":T},
// {"k":"event","n":N,"e":E}, {"k":"progress","p":P} or
// {"k":"end","status":S,"meta":M,"error":{"code":C,"message":M}}.
type jobMessage struct {
	K      string          `json:"k"`
	O      *int64          `json:"o"`
	T      string          `json:"t"`
	N      *int64          `json:"n"`
	E      json.RawMessage `json:"e"`
	P      json.RawMessage `json:"p"`
	Status string          `json:"status"`
	Meta   json.RawMessage `json:"meta"`
	Err    *JobError       `json:"error"`
}

// message applies m, a message of the Client c, to the state and hands
// what it changed to handle.
func (j *Job) message(c *Client, m Message, polls bool, handle func(JobUpdate) error) error {
	j.mu.Lock()
	// Where the Client is before m: the last message applied, or past a
	// gap it accepted (or at the head of another log, after an
	// unknown_cursor gap).
	j.st.Cursor = c.Cursor()
	j.mu.Unlock()
	if m.Gap != nil {
		if m.Gap.Reason == "replay_limit" && polls {
			return errToPolls
		}
		return j.update(handle, func(s *JobState, _ *strings.Builder) *JobUpdate {
			g := JobGap{Reason: m.Gap.Reason, Log: m.Gap}
			s.Gaps = append(s.Gaps, g)
			return &JobUpdate{Gap: &g}
		})
	}
	ev := m.Event
	var msg jobMessage
	if json.Unmarshal(ev.Data, &msg) != nil {
		msg = jobMessage{} // not a job's message: a marker, or written by other means
	}
	switch {
	case msg.K == "text" && msg.O != nil:
		o, t := *msg.O, msg.T
		end := o + len16(t)
		if err := j.hole(handle, TextMissing, o, func(s *JobState) int64 { return s.Next }); err != nil {
			return err
		}
		return j.update(handle, func(s *JobState, text *strings.Builder) *JobUpdate {
			s.Cursor = ev.ID
			if end <= s.Next {
				return nil // held already
			}
			chunk := from16(t, s.Next-o)
			at := s.Next
			text.WriteString(chunk)
			s.Next = end
			return &JobUpdate{Text: &JobText{Chunk: chunk, Offset: at}}
		})
	case msg.K == "event" && msg.N != nil:
		n := *msg.N
		if err := j.hole(handle, EventsMissing, n, func(s *JobState) int64 { return int64(len(s.Events)) }); err != nil {
			return err
		}
		return j.update(handle, func(s *JobState, _ *strings.Builder) *JobUpdate {
			s.Cursor = ev.ID
			if n < int64(len(s.Events)) {
				return nil
			}
			s.Events = append(s.Events, msg.E)
			return &JobUpdate{Event: &JobEvent{N: n, Data: msg.E}}
		})
	case msg.K == "progress" && msg.P != nil:
		return j.update(handle, func(s *JobState, _ *strings.Builder) *JobUpdate {
			s.Cursor, s.Progress = ev.ID, msg.P
			return &JobUpdate{Progress: msg.P}
		})
	case msg.K == "end" && msg.Status != "":
		if err := j.update(handle, func(s *JobState, _ *strings.Builder) *JobUpdate {
			e := &JobEnd{Status: msg.Status, Error: msg.Err}
			if msg.Err == nil {
				e.Meta = msg.Meta
				if e.Meta == nil {
					e.Meta = json.RawMessage("null")
				}
			}
			s.Cursor, s.End = ev.ID, e
			return &JobUpdate{End: e}
		}); err != nil {
			return err
		}
		return errJobEnded
	}
	j.mu.Lock()
	j.st.Cursor = ev.ID
	j.mu.Unlock()
	return nil
}

// hole names, before a message that starts at at, what is missing between
// the position held (s.Next for text, the number of events) and at, as a
// gap of reason. The cursor does not move: the message is applied next.
func (j *Job) hole(handle func(JobUpdate) error, reason string, at int64, held func(*JobState) int64) error {
	return j.update(handle, func(s *JobState, _ *strings.Builder) *JobUpdate {
		from := held(s)
		if at <= from {
			return nil
		}
		g := JobGap{Reason: reason, From: from, To: at}
		s.Gaps = append(s.Gaps, g)
		if reason == TextMissing {
			s.Next = at
		} else {
			for int64(len(s.Events)) < at {
				s.Events = append(s.Events, nil)
			}
		}
		return &JobUpdate{Gap: &g}
	})
}

// update applies change to the state and hands its update (nil: nothing
// to hand) to handle; if handle refuses it, the state is put back.
func (j *Job) update(handle func(JobUpdate) error, change func(s *JobState, text *strings.Builder) *JobUpdate) error {
	j.mu.Lock()
	old := j.st // its slices keep their lengths: appends past them are undone with it
	oldText := j.text.String()
	u := change(&j.st, &j.text)
	j.mu.Unlock()
	if u == nil {
		return nil
	}
	err := handle(*u)
	if err == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.st = old
	if len(oldText) != j.text.Len() {
		j.text = strings.Builder{}
		j.text.WriteString(oldText)
	}
	return err
}

// len16 is s's length in UTF-16 code units, as the job counts (s as
// decoded from JSON: valid UTF-8).
func len16(s string) int64 {
	var n int64
	for _, r := range s {
		if r >= 0x10000 {
			n += 2
		} else {
			n++
		}
	}
	return n
}

// from16 is s from UTF-16 offset k on (k <= 0: all of s); an offset inside
// a surrogate pair starts after the pair, whose first half is held.
func from16(s string, k int64) string {
	var n int64
	for i, r := range s {
		if n >= k {
			return s[i:]
		}
		if r >= 0x10000 {
			n += 2
		} else {
			n++
		}
	}
	return ""
}
