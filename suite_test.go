package replayd_test

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

// The hub's behaviour suite on the SQLite store: each subtest gets a new
// database file, and each hub on it its own *sql.DB, as another process
// would. Then again with DetachConnections on, for the subtests that
// were run detached before they moved to hubtest (TestSSEDetached), and
// on an in-memory database for those that open a single hub (Ready; it was
// the root's TestReady).
func TestHubSuite(t *testing.T) {
	hubtest.Run(t, sqliteLog)
	t.Run("Detached", func(t *testing.T) { hubtest.Run(t, detachedLog) })
	t.Run("Memory", func(t *testing.T) { hubtest.Run(t, memoryLog) })
}

// sqliteLog is the suite's factory: a fresh database file, and hubs on it.
func sqliteLog(t *testing.T) func(opts replayd.Options) *replayd.EventHub {
	path := filepath.Join(t.TempDir(), "log.db")
	return func(opts replayd.Options) *replayd.EventHub { return openHub(t, path, opts) }
}

// openHub opens the database dsn with a pool of its own, as another
// process would, and a hub on it; both are closed at the end of the test.
func openHub(t *testing.T, dsn string, opts replayd.Options) *replayd.EventHub {
	db, err := replayd.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	h, err := replayd.New(db, opts)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		db.Close()
	})
	return h
}

// onMemory names the subtests run on an in-memory database (":memory:",
// one database shared by the pool): those that open a single hub.
var onMemory = map[string]bool{
	"Ready": true,
}

// memoryLog is the suite's factory on an in-memory database, for the
// subtests in onMemory; each call opens a new, empty database.
func memoryLog(t *testing.T) func(opts replayd.Options) *replayd.EventHub {
	_, name, _ := strings.Cut(t.Name(), "/Memory/")
	name, _, _ = strings.Cut(name, "/")
	if !onMemory[name] {
		t.Skip("not run on an in-memory database")
	}
	return func(opts replayd.Options) *replayd.EventHub { return openHub(t, ":memory:", opts) }
}

// servedDetached names the subtests run with DetachConnections on, and
// whether their streams must detach: every guarantee holds on the hijacked
// path too, and HTTP/2 falls back (it detaches nothing).
var servedDetached = map[string]bool{
	"SSEHeadersAndHead":                         true,
	"SSEOrigins":                                true,
	"SSEFreshClientGetsHelloThenLive":           true,
	"SSETopicScopes":                            true,
	"SSEResumeExact":                            true,
	"SSEGapReplayLimit":                         true,
	"SSEGapNegativeReplayLimit":                 true,
	"SSEGapPruned":                              true,
	"SSEGapUnknownCursor":                       true,
	"SSEGapInvalidCursor":                       true,
	"SSEBadInputTable":                          true,
	"SSEMultiLinePayload":                       true,
	"SSERetryAndHeartbeats":                     true,
	"SSEConcurrentPublishAndConnect":            true,
	"SSESlowConsumerDisconnected":               true,
	"SSEResyncWhenRowsPrunedBeforeLiveDelivery": true,
	"SSERetryInHelloBlock":                      true,
	"SSELargestFrameFitsDefaultCap":             true,
	"ScopeHelloShape":                           true,
	"ScopeUnionReplayExactCounts":               true,
	"ScopePrunedWatermarkOfOneTopic":            true,
	"ScopeOverlapDeliveredOnce":                 true,
	"SSETopicQueryStrict":                       true,
	"SSEDeniedTopicNeverVisible":                true,
	"SSERevokedSessionEndsStream":               true,
	"RevokedBeforeServedGetsNothing":            true,
	"SSEOverHTTP2":                              false,
}

// detachedLog is sqliteLog with every hub detaching its streams; it fails
// the subtest unless a stream detached (none, over HTTP/2).
func detachedLog(t *testing.T) func(opts replayd.Options) *replayd.EventHub {
	_, name, _ := strings.Cut(t.Name(), "/Detached/")
	name, _, _ = strings.Cut(name, "/")
	detach, ok := servedDetached[name]
	if !ok {
		t.Skip("not run detached: it serves no SSE stream of its own, or was not before")
	}
	var detached atomic.Int64
	replayd.SetTestHookDetached(func() { detached.Add(1) })
	t.Cleanup(func() { // after the hubs' Close: registered before them
		replayd.SetTestHookDetached(nil)
		if t.Failed() {
			return
		}
		if n := detached.Load(); detach && n == 0 {
			t.Errorf("no stream was served detached")
		} else if !detach && n != 0 {
			t.Errorf("%d streams detached", n)
		}
	})
	open := sqliteLog(t)
	return func(opts replayd.Options) *replayd.EventHub {
		opts.SSE.DetachConnections = true
		return open(opts)
	}
}
