// Package storetest checks that a [replayd.Store] keeps the storage
// contract: every promise of the Store doc, as deterministic subtests, on
// the model of golang.org/x/net/nettest.TestConn. A backend's test runs
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) func() replayd.Store {
//			db := newEmptyDatabase(t)        // a fresh, empty log
//			return func() replayd.Store {    // each call: another store on it
//				s := open(t, db)
//				t.Cleanup(func() { s.Close() })
//				return s
//			}
//		})
//	}
//
// newLog is called once per subtest and must return a function that opens
// a store on a new, empty log; each further call opens another store on
// the same log (as another process or node would), so the subtests can
// check what holds between stores. Each call is an open of the log, which
// raises its sequence floor (see replayd.Store, "Log identity"):
// SequenceFloor checks that. Closing the stores (and the log) is the
// factory's business, with t.Cleanup.
//
// The package chaostest is the other kit: given a factory of hubs on one
// log, it runs the chaos run and its oracle (contiguity or an explicit gap) over the store.
//
// Some subtests wait for the clock to move on (created_at and MaxAge have
// millisecond precision): tens to hundreds of milliseconds each, bounded.
package storetest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// Run runs every subtest of the contract against the stores newLog makes.
func Run(t *testing.T, newLog func(t *testing.T) (open func() replayd.Store)) {
	for _, st := range []struct {
		name string
		fn   func(t *testing.T, open func() replayd.Store)
	}{
		{"AppendSequences", testAppendSequences},
		{"CreatedAtNeverDecreases", testCreatedAt},
		{"Duplicates", testDuplicates},
		{"HeadAfterPruningEverything", testHeadAfterPruneAll},
		{"ReadScopesAndLimits", testRead},
		{"ReadMaxBytes", testReadMaxBytes},
		{"WindowAndCountMatchModel", testWindowModel},
		{"PruneByCount", testPruneByCount},
		{"PruneByAge", testPruneByAge},
		{"PruneTopicsByCount", testPruneTopicsByCount},
		{"PruneTopicsByAge", testPruneTopicsByAge},
		{"PruneTopicsMixedScope", testPruneTopicsMixedScope},
		{"PruneTopicsInvalid", testPruneTopicsInvalid},
		{"PruneTopic", testPruneTopic},
		{"TwoStoresNoSkippedRows", testTwoStores},
		{"SequenceFloor", testSequenceFloor},
		{"StreamsAtomic", testStreamsAtomic},
		{"StreamsRoundTrip", testStreamsRoundTrip},
		{"StreamsMany", testStreamsMany},
		{"StreamsAppendVisibility", testStreamsAppendVisibility},
		{"StreamsRead", testStreamsRead},
		{"StreamsSerialised", testStreamsSerialised},
		{"StreamsDue", testStreamsDue},
	} {
		t.Run(st.name, func(t *testing.T) {
			open := newLog(t)
			st.fn(t, open)
		})
	}
}

// ctxT returns a context bounded for one subtest's calls.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var topics = []string{"a", "b", "c", ""} // "" = broadcast

// ev returns an event to append: a fresh id, a JSON payload of size bytes
// (at least 3).
func ev(id, topic string, size int) replayd.Event {
	size = max(size, 3)
	p, _ := json.Marshal(strings.Repeat("x", size-2))
	return replayd.Event{EventID: id, Type: "message", Topic: topic, Payload: p}
}

// appendAll appends evs and fails the test on an error or a result with
// Err or Duplicate set; it returns the stored events.
func appendAll(t *testing.T, s replayd.Store, evs ...replayd.Event) []replayd.Event {
	t.Helper()
	res, err := s.Append(ctxT(t), evs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	if len(res) != len(evs) {
		t.Fatalf("Append: %d results for %d events", len(res), len(evs))
	}
	out := make([]replayd.Event, len(res))
	for i, r := range res {
		if r.Err != nil || r.Duplicate {
			t.Fatalf("Append: event %d (%s): %+v", i, evs[i].EventID, r)
		}
		out[i] = r.Event
	}
	return out
}

func head(t *testing.T, s replayd.Store) int64 {
	t.Helper()
	h, err := s.Head(ctxT(t))
	if err != nil {
		t.Fatalf("Head: %v", err)
	}
	return h
}

var scopes = [][]string{nil, {"a"}, {"b"}, {"a", "c"}, {"c", "b", "a"}, {"nobody"}}
