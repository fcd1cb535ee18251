// Package hubtest checks an [replayd.EventHub]'s behaviour on any
// [replayd.Store]: the SSE and poll endpoints, replay, gaps, retention and
// subscribers, as subtests over real HTTP, through the exported API only.
// Where storetest checks a store's promises, hubtest checks that the hub
// keeps its own on top of them. A backend's test runs
//
//	func TestHubSuite(t *testing.T) {
//		hubtest.Run(t, func(t *testing.T) func(replayd.Options) *replayd.EventHub {
//			db := newEmptyDatabase(t)                     // a fresh, empty log
//			return func(opts replayd.Options) *replayd.EventHub { // each call: another hub on it
//				s := open(t, db)
//				h, err := replayd.NewWithStore(s, opts)
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(func() { h.Close(); s.Close() })
//				return h
//			}
//		})
//	}
//
// newLog is called by each subtest that needs a fresh log (once per
// subtest, or once per nested subtest where those need logs of their own)
// and must return a function that opens a hub, on its own store, on a new,
// empty log; each further call opens another hub on the same log (as
// another process or node would). Closing hubs and stores is the factory's
// business, with t.Cleanup; a subtest may close a hub itself first
// (EventHub.Close is idempotent).
//
// Many subtests name exact sequences, relative to the head read once the
// hub is open (a log's head is not 0 once it was opened: the sequence
// floor of replayd.Store): they expect the k-th event published after it
// to get the head plus k, each stored event the next integer, as the
// SQLite and PostgreSQL stores do when no append is refused and no store
// opens the log meanwhile. (The Store contract allows holes; a store that
// makes them where these subtests do not refuse anything fails them.)
//
// Some subtests wait for the clock to move on (created_at and MaxAge have
// millisecond precision): tens of milliseconds each, bounded.
package hubtest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// opener opens a hub on one log; see Run.
type opener = func(opts replayd.Options) *replayd.EventHub

// Run runs every subtest of the suite against the hubs newLog makes.
func Run(t *testing.T, newLog func(t *testing.T) (open func(opts replayd.Options) *replayd.EventHub)) {
	for _, st := range subtests {
		t.Run(st.name, func(t *testing.T) { st.fn(t, newLog) })
	}
}

// subtests is the suite; each entry's name is the root package test it
// was, without the Test prefix (PollLongPollWokenThroughTailFromAnotherHub
// is new: the root's TestPollLongPollWokenThroughTail, with a second hub
// for the second process).
var subtests = []struct {
	name string
	fn   func(t *testing.T, newLog func(t *testing.T) opener)
}{
	// publish.go
	{"PublishStoresAndReturnsEvent", testPublishStoresAndReturnsEvent},
	{"PublishRejectsBadInput", testPublishRejectsBadInput},
	{"PublishIdempotentByEventID", testPublishIdempotentByEventID},
	{"PublishIdempotentUnderConcurrency", testPublishIdempotentUnderConcurrency},
	{"ConcurrentPublishOrdering", testConcurrentPublishOrdering},
	{"SubscribeUnsubscribe", testSubscribeUnsubscribe},
	{"ReplayScopes", testReplayScopes},
	// retention.go
	{"HeadNeverGoesBackwards", testHeadNeverGoesBackwards},
	{"PruneByAgeBelowOneSecond", testPruneByAgeBelowOneSecond},
	{"StartRetention", testStartRetention},
	{"TopicRetentionMixedScopeGaps", testTopicRetentionMixedScopeGaps},
	{"TopicRetentionPrunedBeforeLiveDelivery", testTopicRetentionPrunedBeforeLiveDelivery},
	// tail.go
	{"TailDeliversOtherWritersExactlyOnce", testTailDeliversOtherWritersExactlyOnce},
	{"PublishCatchesUpOtherWriters", testPublishCatchesUpOtherWriters},
	// close.go
	{"CloseStopsEverything", testCloseStopsEverything},
	// ready.go
	{"Ready", testReady},
	// sse.go
	{"SSEHeadersAndHead", testSSEHeadersAndHead},
	{"SSEMethods", testSSEMethods},
	{"SSEOrigins", testSSEOrigins},
	{"SSEInvalidTopic", testSSEInvalidTopic},
	{"SSEFreshClientGetsHelloThenLive", testSSEFreshClientGetsHelloThenLive},
	{"SSETopicScopes", testSSETopicScopes},
	{"SSEResumeExact", testSSEResumeExact},
	{"SSEGapReplayLimit", testSSEGapReplayLimit},
	{"SSEGapNegativeReplayLimit", testSSEGapNegativeReplayLimit},
	{"SSEGapPruned", testSSEGapPruned},
	{"SSEGapUnknownCursor", testSSEGapUnknownCursor},
	{"SSEGapInvalidCursor", testSSEGapInvalidCursor},
	{"SSEBadInputTable", testSSEBadInputTable},
	{"SSEMultiLinePayload", testSSEMultiLinePayload},
	{"SSERetryAndHeartbeats", testSSERetryAndHeartbeats},
	{"SSEConcurrentPublishAndConnect", testSSEConcurrentPublishAndConnect},
	{"SSESlowConsumerDisconnected", testSSESlowConsumerDisconnected},
	{"SSEOverHTTP2", testSSEOverHTTP2},
	{"SSEResyncWhenRowsPrunedBeforeLiveDelivery", testSSEResyncWhenRowsPrunedBeforeLiveDelivery},
	// stream.go
	{"SSERetryInHelloBlock", testSSERetryInHelloBlock},
	{"SSELargestFrameFitsDefaultCap", testSSELargestFrameFitsDefaultCap},
	{"SSEWriterWithoutFlush", testSSEWriterWithoutFlush},
	// scope.go
	{"ScopeHelloShape", testScopeHelloShape},
	{"ScopeUnionReplayExactCounts", testScopeUnionReplayExactCounts},
	{"ScopePrunedWatermarkOfOneTopic", testScopePrunedWatermarkOfOneTopic},
	{"ScopeOverlapDeliveredOnce", testScopeOverlapDeliveredOnce},
	// replay.go
	{"ReplayMemoryBoundedAndCloseFast", testReplayMemoryBoundedAndCloseFast},
	// poll.go
	{"PollAnswerShapeAndHeaders", testPollAnswerShapeAndHeaders},
	{"PollFreshRequest", testPollFreshRequest},
	{"PollBadParameters", testPollBadParameters},
	{"PollPagingAndClamping", testPollPagingAndClamping},
	{"PollGaps", testPollGaps},
	{"PollPrunedGapAlone", testPollPrunedGapAlone},
	{"PollLongPollWokenByPublish", testPollLongPollWokenByPublish},
	{"PollCloseAnswersWaitingPolls", testPollCloseAnswersWaitingPolls},
	{"PollAndSSEShareTheCursor", testPollAndSSEShareTheCursor},
	{"PollLongPollWokenThroughTailFromAnotherHub", testPollLongPollWokenThroughTailFromAnotherHub},
	{"PollRandomized", testPollRandomized},
	{"PollMemoryMatchesLog", testPollMemoryMatchesLog},
	{"PollMemoryBounded", testPollMemoryBounded},
	// admit.go
	{"SSETopicQueryStrict", testSSETopicQueryStrict},
	{"SSERevokedContextEndsStream", testSSERevokedContextEndsStream},
	{"SSERevokedSessionEndsStream", testSSERevokedSessionEndsStream},
	{"SSEDeniedTopicNeverVisible", testSSEDeniedTopicNeverVisible},
	{"RevokedBeforeServedGetsNothing", testRevokedBeforeServedGetsNothing},
	// subscribe.go
	{"SubscribeGapWhenRowsPrunedBeforeLiveDelivery", testSubscribeGapWhenRowsPrunedBeforeLiveDelivery},
}

// waitFor bounds every wait in the suite.
const waitFor = wiretest.WaitFor

// frame is one parsed SSE frame; gapJSON a gap frame's data, with nulls
// kept as nil: the wire as the tests read it (internal/wiretest, shared
// with the root's tests and chaostest, with the SSE client and the poll
// requests).
type (
	frame   = wiretest.Frame
	gapJSON = wiretest.Gap
)

// serve starts a real HTTP server for h's handler.
func serve(t testing.TB, h *replayd.EventHub) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func mustPublish(t testing.TB, h *replayd.EventHub, topic string, payload any, opts ...replayd.PublishOption) replayd.Event {
	t.Helper()
	ev, err := h.Publish(context.Background(), topic, payload, opts...)
	if err != nil {
		t.Fatalf("publish %q: %v", topic, err)
	}
	return ev
}

// publishTopics publishes one event to each topic on h, in order, with the
// topic as its payload.
func publishTopics(t testing.TB, h *replayd.EventHub, topics ...string) {
	t.Helper()
	for _, topic := range topics {
		mustPublish(t, h, topic, topic)
	}
}

// waitClock waits until the wall clock is d past at (bounded): so that an
// event created at at is older than any MaxAge below d, on any store (the
// store takes created_at, not the test).
func waitClock(t testing.TB, at time.Time, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Since(at) <= d {
		if time.Now().After(deadline) {
			t.Fatalf("the clock did not pass %v + %v", at, d)
		}
		time.Sleep(time.Millisecond)
	}
}

func i64p(v int64) *int64 { return &v }

// headOf returns h's head. The head of a log is not 0 once it was opened
// (the sequence floor: see replayd.Store), so the subtests that name
// sequences name them relative to the head read after the last open: the
// k-th event published after it is headOf+k.
func headOf(t testing.TB, h *replayd.EventHub) int64 {
	t.Helper()
	head, err := h.LatestSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return head
}

// rel returns base+n for each n: sequences named relative to a head.
func rel(base int64, ns ...int64) []int64 {
	if ns == nil {
		return nil
	}
	out := make([]int64, len(ns))
	for i, n := range ns {
		out[i] = base + n
	}
	return out
}

// relIDs returns the SSE ids of the sequences base+n.
func relIDs(base int64, ns ...int64) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = fmt.Sprint(base + n)
	}
	return out
}
