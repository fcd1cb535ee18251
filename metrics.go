package replayd

import (
	"slices"
	"sync/atomic"
	"time"
)

// Transports, as metrics label them.
const (
	transportSSE  = "sse"
	transportPoll = "poll"
)

// Reasons a request is refused, as metrics label them.
const (
	refusedOverload        = "overload"
	refusedForbidden       = "forbidden"
	refusedUnauthenticated = "unauthenticated"
	refusedOrigin          = "origin"
	refusedBadRequest      = "bad_request"
)

// Metrics is a snapshot of a hub's operational counters, taken by
// [EventHub.Metrics]. Counters only grow while the hub lives; gauges go up
// and down. Module github.com/replayd/replayd/replaydprom exports it to
// Prometheus under the names given below; any other metrics system can read
// the same fields.
//
// The head (replayd_head_sequence) is not in the snapshot: read it with
// [EventHub.LatestSequence] at scrape time. It is the log's head, the number
// clients see in hello frames and the one that counts other processes'
// writes, rather than the hub's live position, which lags other writers
// until this hub next tails or publishes. Reading it takes a context and
// one indexed row, so it stays out of a snapshot that never fails.
type Metrics struct {
	// EventsPublished counts the events this hub stored
	// (replayd_events_published_total): by Publish, PublishBatch, and
	// PublishTx within InTx. A publish whose event id was already stored
	// counts only in PublishDuplicates. PublishTx in a transaction the
	// application commits itself is not counted: the hub does not see
	// whether it committed.
	EventsPublished uint64
	// PublishDuplicates counts publishes that stored nothing because their
	// event id was known (replayd_publish_duplicates_total).
	PublishDuplicates uint64
	// PublishDuration observes, in seconds, every Publish that returned an
	// event, duplicates included, from the hand-over to the writer to the
	// answer: waiting for the writer, the group commit, and delivery to
	// this hub's live subscribers (replayd_publish_duration_seconds).
	PublishDuration Histogram

	// SSEConnections and PollConnections are the open SSE streams and the
	// waiting long polls (replayd_connections, transport "sse" and "poll"):
	// what SSEOptions.MaxConnections caps.
	SSEConnections, PollConnections int64

	// Requests refused, by the answer they got
	// (replayd_requests_refused_total, reason "overload", "forbidden",
	// "unauthenticated", "origin", "bad_request"): over MaxConnections;
	// Authorize's 403 and 401, and a request revoked before it was served
	// (WithRevocation) under "forbidden"; a disallowed Origin (403); a bad
	// topic or poll parameter (400).
	RefusedOverload, RefusedForbidden, RefusedUnauthenticated,
	RefusedOrigin, RefusedBadRequest uint64

	// ReplayedSSE observes the events replayed to each SSE connection,
	// 0 for a fresh one; ReplayedPoll the events in each poll answer
	// (replayd_replayed_events, transport "sse" and "poll").
	ReplayedSSE, ReplayedPoll Histogram

	// Gap frames sent, by reason (replayd_gaps_total, reason
	// "replay_limit", "pruned", "unknown_cursor", "invalid_cursor").
	GapsReplayLimit, GapsPruned, GapsUnknownCursor, GapsInvalidCursor uint64

	// SlowConsumerDisconnects counts connections cut off for passing
	// SSEOptions.MaxBufferedBytes (replayd_slow_consumer_disconnects_total).
	SlowConsumerDisconnects uint64
	// LiveFrames counts event frames queued to live connections, one per
	// connection and event; hellos, gaps, replays and heartbeats are not
	// counted (replayd_live_frames_total).
	LiveFrames uint64
	// PrunedEvents counts rows this hub's retention deleted
	// (replayd_pruned_events_total).
	PrunedEvents uint64
	// TailPolls counts the tail's polls of the log, idle ones included
	// (replayd_tail_polls_total).
	TailPolls uint64
	// PollsFromMemory counts poll answers read from the window of the
	// newest events instead of the log (replayd_poll_memory_answers_total;
	// see PollOptions.MemoryEvents): against the poll transport's replay
	// histogram's count, how often polls are near enough the head.
	PollsFromMemory uint64
	// TailLag is the age of the newest row the tail delivered, measured
	// when a poll last found rows, and 0 once a poll finds nothing new
	// (replayd_tail_lag_seconds). The age is taken from the row's
	// CreatedAt, which the writer stamps with its clock in milliseconds
	// just before the insert, so it is exact to about a millisecond plus
	// the writer's transaction; writers of one SQLite file share the
	// host's clock. A lag that stays up means the tail runs behind what
	// other processes commit. 0 while the hub does not tail.
	TailLag time.Duration
}

// Histogram is a snapshot of a fixed-bucket histogram, in the shape
// Prometheus uses.
type Histogram struct {
	Bounds []float64 // bucket upper bounds, ascending; a last bucket, +Inf, is implied
	Counts []uint64  // Counts[i] is the number of observations <= Bounds[i] (cumulative)
	Count  uint64    // every observation: the +Inf bucket
	Sum    float64   // the sum of the observed values
}

// Bucket upper bounds: publish durations in nanoseconds (50µs to 10s: a
// lone publish commits in ~65µs, a busy database is waited for up to the
// 10s busy timeout), and replayed events (the default ReplayLimit is 100,
// the default poll MaxLimit 1,000).
var (
	publishBounds = []int64{
		50e3, 100e3, 250e3, 500e3, 1e6, 2.5e6, 5e6, 10e6, 25e6, 50e6,
		100e6, 250e6, 500e6, 1e9, 2.5e9, 5e9, 10e9,
	}
	replayBounds = []int64{0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}
)

// maxBounds is the most bounds a histogram may have.
const maxBounds = 17

// histogram counts observations into fixed buckets with atomics: observing
// takes no lock and allocates nothing. Its bounds are passed in, so the zero
// value is ready to use.
type histogram struct {
	counts [maxBounds + 1]atomic.Uint64 // per bucket, not cumulative; the last is +Inf
	sum    atomic.Uint64
}

func (h *histogram) observe(bounds []int64, v int64) {
	v = max(v, 0)
	i, _ := slices.BinarySearch(bounds, v) // the first bound >= v
	h.counts[i].Add(1)
	h.sum.Add(uint64(v))
}

// snapshot reads h without a lock: an observation made meanwhile may be in
// the buckets but not yet in the sum. Values are divided by scale. Count is
// the total of the buckets, so it always agrees with them.
func (h *histogram) snapshot(bounds []int64, scale float64) Histogram {
	s := Histogram{Bounds: make([]float64, len(bounds)), Counts: make([]uint64, len(bounds))}
	var n uint64
	for i, b := range bounds {
		n += h.counts[i].Load()
		s.Bounds[i] = float64(b) / scale
		s.Counts[i] = n
	}
	s.Count = n + h.counts[len(bounds)].Load()
	s.Sum = float64(h.sum.Load()) / scale
	return s
}

// metrics are a hub's operational counters: atomics only, so recording
// never takes a lock or allocates on a hot path.
type metrics struct {
	published, duplicates atomic.Uint64
	publishDur            histogram
	sseConns, pollConns   atomic.Int64
	refusedOverload, refusedForbidden, refusedUnauthenticated,
	refusedOrigin, refusedBadRequest atomic.Uint64
	replayedSSE, replayedPoll                                     histogram
	gapReplayLimit, gapPruned, gapUnknownCursor, gapInvalidCursor atomic.Uint64
	slowConsumerCuts, liveFrames, prunedEvents, tailPolls         atomic.Uint64
	pollMemory                                                    atomic.Uint64
	tailLagNanos                                                  atomic.Int64
}

// Metrics returns a snapshot of the hub's counters. It takes no lock and
// reads nothing from the log, so it is cheap and never fails; it works
// after Close too. Counters read one by one may be a few events apart
// from each other.
func (h *EventHub) Metrics() Metrics {
	m := &h.metrics
	return Metrics{
		EventsPublished:         m.published.Load(),
		PublishDuplicates:       m.duplicates.Load(),
		PublishDuration:         m.publishDur.snapshot(publishBounds, 1e9),
		SSEConnections:          m.sseConns.Load(),
		PollConnections:         m.pollConns.Load(),
		RefusedOverload:         m.refusedOverload.Load(),
		RefusedForbidden:        m.refusedForbidden.Load(),
		RefusedUnauthenticated:  m.refusedUnauthenticated.Load(),
		RefusedOrigin:           m.refusedOrigin.Load(),
		RefusedBadRequest:       m.refusedBadRequest.Load(),
		ReplayedSSE:             m.replayedSSE.snapshot(replayBounds, 1),
		ReplayedPoll:            m.replayedPoll.snapshot(replayBounds, 1),
		GapsReplayLimit:         m.gapReplayLimit.Load(),
		GapsPruned:              m.gapPruned.Load(),
		GapsUnknownCursor:       m.gapUnknownCursor.Load(),
		GapsInvalidCursor:       m.gapInvalidCursor.Load(),
		SlowConsumerDisconnects: m.slowConsumerCuts.Load(),
		LiveFrames:              m.liveFrames.Load(),
		PrunedEvents:            m.prunedEvents.Load(),
		TailPolls:               m.tailPolls.Load(),
		PollsFromMemory:         m.pollMemory.Load(),
		TailLag:                 time.Duration(m.tailLagNanos.Load()),
	}
}

func (m *metrics) publishedEvents(n int) { m.published.Add(uint64(n)) }
func (m *metrics) duplicate()            { m.duplicates.Add(1) }

// publishDuration records how long one Publish took to commit.
func (m *metrics) publishDuration(d time.Duration) {
	m.publishDur.observe(publishBounds, int64(d))
}

// connOpened and connClosed track open SSE streams and waiting long polls.
func (m *metrics) connOpened(transport string) { m.conns(transport).Add(1) }
func (m *metrics) connClosed(transport string) { m.conns(transport).Add(-1) }

func (m *metrics) conns(transport string) *atomic.Int64 {
	if transport == transportPoll {
		return &m.pollConns
	}
	return &m.sseConns
}

// refused counts a request refused for reason (one of the refused* names).
func (m *metrics) refused(reason string) {
	switch reason {
	case refusedOverload:
		m.refusedOverload.Add(1)
	case refusedForbidden:
		m.refusedForbidden.Add(1)
	case refusedUnauthenticated:
		m.refusedUnauthenticated.Add(1)
	case refusedOrigin:
		m.refusedOrigin.Add(1)
	case refusedBadRequest:
		m.refusedBadRequest.Add(1)
	}
}

// replayed records the events in one SSE replay or one poll answer.
func (m *metrics) replayed(transport string, n int) {
	if transport == transportPoll {
		m.replayedPoll.observe(replayBounds, int64(n))
		return
	}
	m.replayedSSE.observe(replayBounds, int64(n))
}

// gap counts a gap sent, by its reason.
func (m *metrics) gap(reason string) {
	switch reason {
	case reasonReplayLimit:
		m.gapReplayLimit.Add(1)
	case reasonPruned:
		m.gapPruned.Add(1)
	case reasonUnknownCursor:
		m.gapUnknownCursor.Add(1)
	case reasonInvalidCursor:
		m.gapInvalidCursor.Add(1)
	}
}

// SlowConsumerCut and FramesQueued make metrics live delivery's sink
// (live.Sink): it counts frames per dispatch, not per frame.
func (m *metrics) SlowConsumerCut()      { m.slowConsumerCuts.Add(1) }
func (m *metrics) FramesQueued(n uint64) { m.liveFrames.Add(n) }
func (m *metrics) pruned(n int64)        { m.prunedEvents.Add(uint64(n)) }
func (m *metrics) tailPolled()           { m.tailPolls.Add(1) }

// tailLag records the age of the newest row a tail poll delivered; 0 when
// it found nothing new.
func (m *metrics) tailLag(d time.Duration) { m.tailLagNanos.Store(int64(max(d, 0))) }
