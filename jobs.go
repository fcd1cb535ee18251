package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/internal/jobs"
	"github.com/replayd/replayd/storage"
)

// Job streams (SPEC §20): an upstream's output, resumable across reloads,
// restarts and nodes. A job is a Durable Stream (docs/durable-streams.md)
// of the topic JobsOptions.TopicPrefix + its id, closed at its end, whose
// record holds the job's lifecycle; see docs/jobs.md.

// JobsOptions configures EventHub.Jobs. Zero values take the defaults.
type JobsOptions struct {
	// TopicPrefix is put before a job's id to make its stream's topic;
	// default "jobs/".
	TopicPrefix string
	// AbandonAfter: a running job nobody read (through Jobs.Read, the
	// relay handler, Handler() or PollHandler() on its topic, or the
	// Durable Streams protocol, on any node; an SSE stream or a long poll
	// counts for as long as it is open) for this long ends error
	// abandoned and its upstream's context is cancelled; default 10
	// minutes.
	AbandonAfter time.Duration
	// Retention: a finished job is kept this long, then deleted (reads
	// answer not found); default 10 minutes.
	Retention time.Duration
	// Lease: the node running a job renews its claim every Lease/3; a job
	// whose claim lapsed (its node died) ends error interrupted when
	// another node, or this one restarted, reads or starts it; default 15 s.
	Lease time.Duration
	// Linger is the least time between two commits of the node's jobs'
	// output: one commit takes what every job has pending (default 50 ms:
	// about 20 commits/s per node however many jobs run); a job's pending
	// MaxBuffer bytes are committed without waiting (default 16 KiB).
	Linger    time.Duration
	MaxBuffer int
}

// Jobs starts and reads job streams on a hub. Its methods are safe for
// concurrent use; Close of the hub cancels the running upstreams' contexts
// and waits for them.
type Jobs struct {
	h *EventHub
	m *jobs.Manager
}

// Job status values (JobInfo.Status).
const (
	JobStreaming = jobs.Streaming
	JobComplete  = jobs.Complete
	JobError     = jobs.Error
)

// Error codes of a job that ended JobError (JobErrorInfo.Code).
const (
	JobFailed      = jobs.CodeFailed
	JobPanicked    = jobs.CodePanicked
	JobAbandoned   = jobs.CodeAbandoned
	JobInterrupted = jobs.CodeInterrupted
)

type (
	// JobStatus is a job's lifecycle state.
	JobStatus = jobs.Status
	// JobFunc is an upstream: it writes the job's text, events and
	// progress through w until it returns; a non-nil meta is the job's
	// final metadata (JSON). An error, or a panic, ends the job error.
	JobFunc = jobs.Func
	// JobWriter is what an upstream writes through: Write/WriteString
	// (text, coalesced), Emit (ordered events), Progress (latest only).
	JobWriter = jobs.Writer
	// JobProgress is a progress snapshot.
	JobProgress = jobs.Progress
	// JobInfo is what a job's record says of it.
	JobInfo = jobs.Info
	// JobErrorInfo says why a job ended JobError.
	JobErrorInfo = jobs.ErrorInfo
	// JobPoll is one read of a job from a text and an event offset.
	JobPoll = jobs.Poll
)

// ErrJobNotFound is the error of a read of a job that does not exist
// (never started, or deleted after its retention).
var ErrJobNotFound = jobs.ErrNotFound

// ErrJobEnded is a JobWriter's once its job ended.
var ErrJobEnded = jobs.ErrEnded

// Jobs returns the hub's job streams with opts. Its store must be a
// storage.StreamStore (SQLite and PostgreSQL are); it starts the hub's
// sweep of Durable Streams, which deletes finished jobs after their
// retention. Call it once per hub.
func (h *EventHub) Jobs(opts JobsOptions) (*Jobs, error) {
	ss, ok := h.store.(storage.StreamStore)
	if !ok {
		return nil, errors.New("replayd: jobs: the hub's store does not keep Durable Streams")
	}
	if opts.TopicPrefix == "" {
		opts.TopicPrefix = "jobs/"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.AbandonAfter, 10*time.Minute)
	def(&opts.Retention, 10*time.Minute)
	def(&opts.Lease, 15*time.Second)
	def(&opts.Linger, 50*time.Millisecond)
	if opts.MaxBuffer <= 0 {
		opts.MaxBuffer = 16 << 10
	}
	prune := h.durablePrune()
	h.startDurableSweep(ss, prune)
	m := jobs.New(jobs.Config{
		Store: ss, Deliver: h.deliverCommitted, DataType: h.opts.DefaultType,
		Sweeper: &durable.Sweeper{Store: ss, Prune: prune, Now: time.Now},
		Go:      h.goLoop, Ctx: h.ctx, Logger: h.logger, Now: time.Now,
		TopicPrefix: opts.TopicPrefix, Lease: opts.Lease, AbandonAfter: opts.AbandonAfter,
		Retention: opts.Retention, Linger: opts.Linger, MaxBuffer: opts.MaxBuffer,
	})
	h.reads.Store(m)
	return &Jobs{h: h, m: m}, nil
}

// reading is the hook Handler(), PollHandler() and DurableStreams() call
// with the topics of a read (an SSE stream while it is open, a poll while
// it waits, a Durable Streams read): once Jobs was called, the reads of a
// job's topic count against its abandonment (internal/jobs/readers.go).
// done (nil when the read concerns no job) ends the read.
func (h *EventHub) reading(topics []string) (done func()) {
	if m := h.reads.Load(); m != nil {
		return m.Reading(topics)
	}
	return nil
}

// Start starts job id (a generated UUIDv7 when id is "") running fn on
// this node, unless a job of that id exists (on any node sharing the
// store): then it returns that job and started false, and fn never runs.
func (j *Jobs) Start(ctx context.Context, id string, fn JobFunc) (info JobInfo, started bool, err error) {
	return j.m.Start(ctx, id, fn)
}

// Get returns what job id's record says (ErrJobNotFound when none).
func (j *Jobs) Get(ctx context.Context, id string) (JobInfo, error) { return j.m.Get(ctx, id) }

// Read reads job id from text offset since (UTF-16 code units) and event
// offset eventSince; it counts as a read for abandonment.
func (j *Jobs) Read(ctx context.Context, id string, since, eventSince int64) (*JobPoll, error) {
	return j.m.Read(ctx, id, since, eventSince, false)
}

// Topic is the topic of job id's stream, which Handler(), PollHandler(),
// the Go client and DurableStreams() (at its path) read.
func (j *Jobs) Topic(id string) string { return j.m.Topic(id) }

// JobsRelayOptions configures Jobs.RelayHandler.
type JobsRelayOptions struct {
	// Prefix is where the handler is mounted: its routes are Prefix +
	// "streams" (POST) and Prefix + "streams/{id}" (GET); default "/".
	Prefix string
	// Upstream makes the job a POST starts from the body's payload (nil
	// when it has none). Required.
	Upstream func(r *http.Request, payload json.RawMessage) JobFunc
	// Authorize decides each request (method "POST" or "GET"; the stream
	// id, "" for a POST that names none): an error refuses it, 401 when
	// errors.Is(err, ErrUnauthenticated), else 403. Nil allows all.
	Authorize func(r *http.Request, method, streamID string) error
}

// RelayHandler serves the stream-relay wire protocol v2 over the jobs
// (POST /streams, GET /streams/{id}?since=N&eventSince=M; docs/jobs.md),
// so that a client written for stream-relay follows jobs unchanged.
func (j *Jobs) RelayHandler(opts JobsRelayOptions) http.Handler {
	return j.m.Relay(jobs.RelayConfig{Prefix: opts.Prefix, Upstream: opts.Upstream, Authorize: opts.Authorize,
		Unauthenticated: func(err error) bool { return errors.Is(err, ErrUnauthenticated) }})
}
