package replayd

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayd/replayd/internal/event"
	"github.com/replayd/replayd/internal/jobs"
	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// ErrAlreadyTailing is returned by a second StartTail on the same hub while
// the first is still running.
var ErrAlreadyTailing = errors.New("replayd: hub is already tailing")

// ErrClosed is returned by calls on a hub after Close.
var ErrClosed = errors.New("replayd: hub is closed")

// ErrUnauthenticated, returned (possibly wrapped) by Options.Authorize,
// answers the request 401 instead of 403.
var ErrUnauthenticated = errors.New("replayd: unauthenticated")

// Options configures an EventHub. The zero value is ready to use.
type Options struct {
	DefaultType string       // SSE event type when Publish gets none; default "message"
	SSE         SSEOptions   // the SSE endpoint's behaviour
	Logger      *slog.Logger // tail, retention and stream errors (docs/operations.md lists the records); nil: discard

	// Authorize, if set, decides every SSE and poll request before anything
	// is read from the log, given the request's topics in the order first
	// requested (empty for the global scope: every event). A nil error
	// grants exactly that scope; an error refuses the request with 401 when
	// errors.Is(err, ErrUnauthenticated), else 403. The error's text is
	// logged at debug level, never sent. It gets its own copy of the
	// topics (nil for the global scope) and is not called for OPTIONS, nor
	// for a request the method, origin, topic or connection checks already
	// refused. A 401 carries no WWW-Authenticate header: wrap the handler to
	// add one. See docs/authorization.md in the repository.
	Authorize func(r *http.Request, topics []string) error
	// Poll configures the handler returned by EventHub.PollHandler.
	Poll PollOptions
}

// PollOptions configures the poll transport. Zero values mean the defaults.
//
// Whatever the payloads, an answer is cut once its events hold 4 MiB of
// payload (at least one event; more is then true, and the client asks for
// the next page at once), and a large answer is written through a small
// buffer: a poll holds less than 5 MiB of events (payloads are at most
// 1 MiB) and a 32 KiB buffer, however large limit is. A client paging
// through large events gets fewer than limit per answer.
type PollOptions struct {
	// MaxWait is the longest a long poll is held; default 30s; negative:
	// no long polling (wait is treated as 0).
	MaxWait time.Duration
	// MaxLimit is the most events one answer holds; default 1000.
	MaxLimit int
	// MemoryEvents and MemoryBytes bound the window of the newest events
	// this hub delivered that it keeps to answer polls near the head
	// without reading the log (the answer is the log's, byte for byte):
	// default 16,384 events and 4 MiB of payload. Negative: no window,
	// every poll reads the log.
	MemoryEvents int
	MemoryBytes  int
}

// SSEOptions configures the handler returned by EventHub.Handler. Zero
// values mean the defaults given; negative values mean "off" where noted.
type SSEOptions struct {
	// TopicParam is the query parameter naming the topic; default "topic".
	// It may be repeated for several topics; each value is trimmed, blank
	// ones ignored; none: the global scope, every event.
	TopicParam string
	// AllowedOrigins lists the origins (scheme://host[:port]) allowed to
	// connect. Empty: same-origin requests only. []string{"*"}: any origin.
	// Requests without an Origin header are always served.
	AllowedOrigins []string
	// ReplayLimit is the most events a reconnecting client is replayed;
	// anything older it missed is named in a gap frame. Default 100;
	// negative: replay nothing, so any backlog is a gap.
	ReplayLimit int
	// HeartbeatInterval is how often an idle stream gets a heartbeat frame.
	// Default 15s; negative: no heartbeats.
	HeartbeatInterval time.Duration
	// HeartbeatData, if set, is called for each heartbeat with the
	// connection's topic when it has exactly one, else "". An object it returns
	// is merged into the heartbeat's data; any other non-nil value is sent
	// under "data".
	HeartbeatData func(topic string) any
	// GapEventType is the SSE event type of gap frames; default "gap".
	GapEventType string
	// Retry, if positive, is sent as the SSE retry field in the hello's
	// block (a block of its own reaches some Go clients as an empty
	// event): how long a browser waits before reconnecting. 0: not sent.
	Retry time.Duration
	// MaxBufferedBytes caps each connection's unsent live frames. A client
	// past the cap is disconnected and resumes from the log when it
	// reconnects. The cap applies once a frame is unsent: a connection
	// with nothing unsent always takes the next frame, however large, so
	// no payload Publish accepts cuts a client that keeps up. Its unsent
	// bytes are at most max(MaxBufferedBytes, one frame); a frame is at
	// most about 7 MiB (a 1 MiB payload whose every byte is a line break
	// costs a "data: " line each), and is shared by every connection.
	// Default 1 MiB; negative: no cap.
	MaxBufferedBytes int
	// MaxTopics is the most distinct topics one request may name; default
	// 32. A request naming more is refused with 400.
	MaxTopics int
	// MaxConnections caps the hub's open SSE streams plus its waiting long
	// polls; 0: no cap. Past it an SSE request gets 200 with only a retry
	// field and a comment, so an EventSource comes back by itself later,
	// and a poll gets 503 with Retry-After.
	MaxConnections int
	// OverloadRetry is the base of the reconnect delay told to a client
	// refused by MaxConnections, and to a poll that reaches a closed hub
	// or a log that cannot be read (Retry-After): drawn between 1x and 2x
	// of it, so that refused clients do not all come back at once;
	// default 5s.
	OverloadRetry time.Duration
	// DetachConnections serves each HTTP/1.1 stream on the connection
	// itself, taken over from net/http (http.Hijacker) once the request is
	// admitted: the handler returns, and an idle stream holds about 8 KiB
	// (one goroutine on a small stack), against some 28 KiB through
	// net/http (see BENCHMARKS.md). The
	// response is then delimited by the connection's end (Connection:
	// close). HTTP/2, and a ResponseWriter that cannot hijack, are served
	// as usual. http.Server.Shutdown does not wait for detached streams and
	// http.Server.Close does not close them: call Close on the hub first,
	// which ends them. A client that leaves is noticed at once on Linux,
	// elsewhere at the next write (at the latest the next heartbeat).
	// Middleware that wraps the ResponseWriter sees only the request, not
	// the stream's bytes, and cancelling the request's context does not end
	// a detached stream (it ended when the handler returned): revoke access
	// with WithRevocation.
	DetachConnections bool
}

// Defaults.
const (
	defaultType              = event.DefaultType
	defaultTopicParam        = "topic"
	defaultReplayLimit       = 100
	defaultHeartbeatInterval = 15 * time.Second
	defaultGapEventType      = "gap"
	defaultMaxBufferedBytes  = 1 << 20
	defaultMaxTopics         = 32
	defaultOverloadRetry     = 5 * time.Second
	defaultPollMaxWait       = 30 * time.Second
	defaultPollMaxLimit      = 1000
)

// withDefaults returns opts with every zero value replaced by its default.
func (opts Options) withDefaults() (Options, error) {
	if opts.DefaultType == "" {
		opts.DefaultType = defaultType
	}
	if err := validateName("default event type", opts.DefaultType); err != nil {
		return opts, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &opts.SSE
	if s.TopicParam == "" {
		s.TopicParam = defaultTopicParam
	}
	switch {
	case s.ReplayLimit == 0:
		s.ReplayLimit = defaultReplayLimit
	case s.ReplayLimit < 0:
		s.ReplayLimit = 0
	}
	if s.HeartbeatInterval == 0 {
		s.HeartbeatInterval = defaultHeartbeatInterval
	}
	if s.GapEventType == "" {
		s.GapEventType = defaultGapEventType
	}
	if err := validateName("gap event type", s.GapEventType); err != nil {
		return opts, err
	}
	if s.MaxBufferedBytes == 0 {
		s.MaxBufferedBytes = defaultMaxBufferedBytes
	}
	if s.MaxTopics <= 0 {
		s.MaxTopics = defaultMaxTopics
	}
	if s.MaxConnections < 0 {
		s.MaxConnections = 0
	}
	if s.OverloadRetry <= 0 {
		s.OverloadRetry = defaultOverloadRetry
	}
	s.AllowedOrigins = append([]string(nil), s.AllowedOrigins...)
	p := &opts.Poll
	switch {
	case p.MaxWait == 0:
		p.MaxWait = defaultPollMaxWait
	case p.MaxWait < 0:
		p.MaxWait = 0
	}
	if p.MaxLimit <= 0 {
		p.MaxLimit = defaultPollMaxLimit
	}
	if p.MemoryEvents == 0 {
		p.MemoryEvents = live.WindowEvents
	}
	if p.MemoryBytes == 0 {
		p.MemoryBytes = live.WindowBytes
	}
	return opts, nil
}

// EventHub publishes events to the log and streams them to SSE clients and
// in-process subscribers. Create one with New; it is safe for concurrent use.
type EventHub struct {
	opts    Options
	log     *EventLog
	store   Store     // the log, reached only through the contract
	owned   io.Closer // what the hub created itself and closes: New's SQLite store
	logger  *slog.Logger
	clients *TopicClientTracker
	metrics metrics

	// queue carries Publish calls to the writer goroutine. A request is
	// either taken by the writer, which then always answers it, or never
	// stored: withdrawn by its caller, or refused when the hub closes.
	queue pubQueue
	// commitMu is held by whoever commits and delivers: the writer
	// goroutine for a batch, or a lone Publish for its own event (see
	// commitAlone). Commits and their deliveries never overlap.
	commitMu sync.Mutex
	// alone: a lone Publish may commit on its own goroutine (commitAlone).
	// Only over a store that is a storage.PromptAppender (the SQLite
	// store), whose Append gives up when its ctx ends whatever it waits
	// for, so that Publish still returns with its ctx. Over another store,
	// a call deaf to its ctx holds up the writer, and the caller can leave.
	alone bool

	live *live.Hub   // live delivery (internal/live)
	txp  txPublisher // InTx and PublishTx (tx.go)

	// reads is told of the reads of the handlers, by topic (see reading,
	// jobs.go): the hub's Jobs, once EventHub.Jobs was called; nil costs
	// nothing.
	reads atomic.Pointer[jobs.Manager]

	// conns counts open SSE streams and waiting long polls, against
	// SSEOptions.MaxConnections (see acquireSlot).
	conns atomic.Int64
	// handshakes holds a slot for every SSE log read in progress (handshake
	// and replay pages): fewer than the pool's connections, so a storm of
	// connecting clients queues here and leaves the writer's connection and
	// one for the live catch-up free.
	handshakes chan struct{}

	ctx    context.Context // cancelled by Close: ends tail and retention
	cancel context.CancelFunc
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	// noFlushLogged is set once a ResponseWriter that cannot flush was
	// logged, so a misconfigured server logs it once, not per request.
	noFlushLogged atomic.Bool

	// writeCtx bounds the writer's commits. Close cancels it when a commit
	// outlives closeGrace (another process holding the write lock, say).
	writeCtx    context.Context
	writeCancel context.CancelFunc
	// publishing counts the events of the Publish and PublishBatch calls
	// in progress: the writer waits for as many to fill a batch (see
	// writeLoop).
	publishing atomic.Int64
	// abandoned is closed when Close gives up waiting for the writer: a
	// Publish still waiting for its answer then returns ErrOutcomeUnknown.
	abandoned chan struct{}

	mu      sync.Mutex // guards the fields below, and wg.Add after Close
	closed  bool
	tailing bool
	// sweeping: the Durable Streams sweep runs (durable.go).
	sweeping bool

	// Test hooks, run by the SSE handler if set: after subscribing and
	// before reading the log, and between the replay and going live.
	testHookAfterSubscribe, testHookBeforeLive func()
	// testHookCommit, if set, is run before each batch's commit, by the
	// writer or by a lone Publish (commitAlone).
	testHookCommit func()
	// testHookReplayPage runs after each replay page is written, with the
	// last sequence written.
	testHookReplayPage func(last int64)
}

// New returns a hub over db, creating the schema if it is missing: the
// hub is NewWithStore over the SQLite store (see [NewSQLiteStore]), which
// it closes itself when it is closed. The hub never closes db: the caller
// owns it. Rows already in the log are never delivered live; clients get
// them by replay.
func New(db *sql.DB, opts Options) (*EventHub, error) {
	if db == nil {
		return nil, errors.New("replayd: new: nil *sql.DB")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s, err := sqlitestore.Open(db, sqlitestore.Options{Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	return newHub(s, opts, s)
}

// EnsureSchema creates the log's tables and index if they are missing. New
// calls it; it is safe to call again and from several processes at once.
// For a Store that is not a [storage.SchemaEnsurer] it does nothing.
func (h *EventHub) EnsureSchema(ctx context.Context) error {
	se, ok := h.store.(storage.SchemaEnsurer)
	if !ok {
		return nil
	}
	if err := se.EnsureSchema(ctx); err != nil {
		return fmt.Errorf("replayd: ensure schema: %w", err)
	}
	return nil
}

// Publish appends an event to the log and delivers it to live subscribers.
// topic "" is a broadcast, delivered to every connection. The payload is
// encoded with encoding/json; a json.RawMessage or []byte must hold valid
// JSON and is stored as given.
//
// Publish returns after the row is durably committed, with its sequence,
// and after it has been handed to every live subscriber of this hub. It
// never waits on an SSE client. Concurrent calls are committed together in
// one transaction (group commit); a bad event fails only its own call.
//
// A ctx that is already done stores nothing. If ctx ends while the event
// is being committed, Publish returns an error wrapping both
// ErrOutcomeUnknown and ctx's error: the event may or may not be stored.
// So does an error the store reports as ErrOutcomeUnknown (a connection to
// a database server that broke after the batch was sent, say). WithEventID
// makes the retry safe. An error wrapping ErrClosed means nothing was
// stored.
func (h *EventHub) Publish(ctx context.Context, topic string, payload any, opts ...PublishOption) (Event, error) {
	h.publishing.Add(1)
	defer h.publishing.Add(-1)
	po := event.Options{Type: h.opts.DefaultType}
	for _, o := range opts {
		o(&po)
	}
	req, err := h.publishReq(topic, payload, po)
	if err != nil {
		return Event{}, err
	}
	start := time.Now()
	if h.alone && h.publishing.Load() == 1 && h.commitMu.TryLock() {
		r := h.commitAlone(ctx, req, start)
		return r.ev, r.err
	}
	if err := h.enqueue(ctx, req); err != nil {
		return Event{}, err
	}
	r := h.await(ctx, req, req, start)
	return r.ev, r.err
}

// PublishBatch publishes evs, each stored or refused on its own, and
// returns one result per event, in order. Of each event only EventID
// (empty: a fresh UUIDv7), Type (empty: Options.DefaultType), Topic and
// Payload (valid JSON) are used. The valid events are handed to the writer
// in one piece and committed in one transaction, with whatever other
// publishes are waiting. A refused event (Err set) stores nothing and does
// not affect the others; a Duplicate stored nothing and carries the
// original event. The errors and their meaning are Publish's
// (ErrOutcomeUnknown among them), per event.
func (h *EventHub) PublishBatch(ctx context.Context, evs []Event) []AppendResult {
	out := make([]AppendResult, len(evs))
	reqs := make([]*publishReq, len(evs))
	var group []*publishReq
	start := time.Now()
	for i, ev := range evs {
		po := event.Options{Type: h.opts.DefaultType, EventID: ev.EventID, EventIDSet: ev.EventID != ""}
		if ev.Type != "" {
			po.Type = ev.Type
		}
		out[i].Event = ev
		req, err := h.publishReq(ev.Topic, json.RawMessage(ev.Payload), po)
		if err != nil {
			out[i].Err = err
			continue
		}
		reqs[i] = req
		group = append(group, req)
	}
	if len(group) == 0 {
		return out
	}
	// One send hands the writer every valid event: they are committed in
	// one transaction, not spread over the writer's next batches.
	group[0].group = group
	h.publishing.Add(int64(len(group)))
	defer h.publishing.Add(-int64(len(group)))
	if err := h.enqueue(ctx, group[0]); err != nil {
		for i, req := range reqs {
			if req != nil {
				out[i].Err = err
			}
		}
		return out
	}
	for i, req := range reqs {
		if req == nil {
			continue
		}
		r := h.await(ctx, group[0], req, start)
		out[i] = AppendResult{Event: r.ev, Duplicate: r.dup, Err: r.err}
		if r.err != nil {
			out[i].Event = evs[i]
		}
	}
	return out
}

// Subscribe registers fn to receive every event delivered live by this hub,
// of every topic, exactly once and in sequence order, until unsubscribe is
// called. fn runs on the delivering goroutine, under the hub's delivery
// lock (for this hub's own publishes, before Publish returns): it must
// return quickly and must not call Publish. unsubscribe may be called from inside fn; once it
// returns, fn is not called again. Rows the hub cannot deliver live (see
// SubscribeWithGaps) are skipped without a word: a subscriber that must know
// uses SubscribeWithGaps.
func (h *EventHub) Subscribe(fn func(Event)) (unsubscribe func()) {
	return h.live.Subscribe(fn, nil)
}

// SubscribeWithGaps is Subscribe for a subscriber that must know when it
// misses something: fn receives events as with Subscribe, and gap is called
// for every hole, before any event that follows it and on the same
// goroutine, so the two callbacks together see the live history in order.
// A hole is a range of rows this hub could not deliver live: rows retention
// deleted (or that could not be read) before delivery, or a log reset from
// outside (see [Gap]). Treat a gap as "re-sync from a snapshot", as an SSE
// client treats a gap frame. Either callback may be nil.
func (h *EventHub) SubscribeWithGaps(fn func(Event), gap func(Gap)) (unsubscribe func()) {
	return h.subscribe(fn, gap)
}

// Replay returns up to limit of the oldest events visible to topic whose
// sequence is above since; see EventLog.Replay.
func (h *EventHub) Replay(ctx context.Context, topic string, since int64, limit int) ([]Event, error) {
	return h.log.Replay(ctx, topic, since, limit)
}

// LatestSequence returns the head: the highest sequence ever assigned.
func (h *EventHub) LatestSequence(ctx context.Context) (int64, error) {
	return h.log.LatestSequence(ctx)
}

// Stats reports the head and, for every topic with an SSE connection open
// or closed recently, its active connection count (see
// TopicClientTracker.Snapshot for which idle topics are kept).
func (h *EventHub) Stats(ctx context.Context) (Stats, error) {
	head, err := h.LatestSequence(ctx)
	if err != nil {
		return Stats{}, err
	}
	return Stats{LatestSequence: head, Topics: h.clients.Snapshot()}, nil
}

// Stats is a snapshot of a hub.
type Stats struct {
	LatestSequence int64        `json:"latestSequence"`
	Topics         []TopicStats `json:"topics"` // sorted by topic; "" is global connections
}

// Handler returns the SSE endpoint. Mount it wherever you like:
//
//	mux.Handle("/events", hub.Handler())
//
// A request names its scope with the topic parameter (SSEOptions.TopicParam,
// repeatable) and its cursor with the Last-Event-ID header, or failing that
// the lastEventId query parameter; PROTOCOL.md in the repository describes
// every frame and status code. Middleware in front of it must let it flush:
// the ResponseWriter it passes on must implement http.Flusher, or have an
// Unwrap() http.ResponseWriter method leading to one, as
// http.ResponseController needs; otherwise every stream is refused with 500
// and the cause is logged at Error, once. Each write to a client must finish
// within 7.5-15s, or the client is disconnected (it resumes from the log).
func (h *EventHub) Handler() http.Handler { return (*sseHandler)(h) }

// Log returns the hub's event log.
func (h *EventHub) Log() *EventLog { return h.log }

// Clients returns the tracker of the hub's SSE connections.
func (h *EventHub) Clients() *TopicClientTracker { return h.clients }

// Close stops tailing and retention, ends every open SSE stream, waits for
// every goroutine the hub started, and lets a publish already being
// committed finish if it can within closeGrace (half a second). Past that —
// another process holding the write lock, say — the commit is cancelled and
// its publishes return ErrClosed: nothing was stored (or ErrOutcomeUnknown,
// from a store that cannot tell, such as a database server that may have
// received the batch already). So Close returns within
// about a second whatever another process does. Should the writer not stop
// even then (a cancelled database call that does not return), Close gives up
// on it after another second, returns an error, and its publishes return
// ErrOutcomeUnknown. Publishes after Close return ErrClosed. Close does not
// close the *sql.DB.
func (h *EventHub) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.cancel()
	close(h.done)
	h.mu.Unlock()
	h.live.Close() // ends every open SSE stream
	stopped := make(chan struct{})
	go func() {
		h.wg.Wait()
		// A lone Publish may be committing on its own goroutine; once it
		// lets go, any other finds the hub closed.
		h.commitMu.Lock()
		h.commitMu.Unlock() //lint:ignore SA2001 waiting for the commit in progress is the point
		close(stopped)
	}()
	timer := time.NewTimer(closeGrace)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		h.writeCancel()
		timer.Reset(closeAbandon)
		select {
		case <-stopped:
		case <-timer.C:
			close(h.abandoned)
			go func() { // release the writer's connection when it stops at last
				<-stopped
				if h.owned != nil {
					h.owned.Close()
				}
			}()
			h.logger.Error("replayd: close: the writer did not stop after its commit was cancelled; abandoning it",
				"waited", closeGrace+closeAbandon)
			return fmt.Errorf("replayd: close: the writer did not stop within %v; publishes in flight return ErrOutcomeUnknown",
				closeGrace+closeAbandon)
		}
	}
	h.writeCancel()
	if h.owned != nil {
		h.owned.Close()
	}
	return nil
}

// closeGrace is how long Close lets a commit in flight finish before
// cancelling it; closeAbandon how long it then waits for the writer to stop.
const (
	closeGrace   = 500 * time.Millisecond
	closeAbandon = time.Second
)

// goLoop runs fn on a goroutine that Close waits for, unless the hub is
// closed already.
func (h *EventHub) goLoop(fn func()) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		fn()
	}()
	return nil
}
