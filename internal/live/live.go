// Package live is a hub's live delivery: one live position, and the
// subscribers every row above it reaches exactly once, in sequence order,
// whichever path brought the row (the hub's own publish, or the tail
// reading other processes' writes). Its subscribers are SSE streams' queues
// (queue.go), in-process callbacks and waiting long polls (subs.go); it
// keeps the newest rows it dispatched to answer polls near the head
// (window.go, probe.go).
//
// The package alone takes its locks, in this order (docs/design.md,
// "Goroutines and locks"): Hub.catchMu, then Hub.mu, then Hub.subsMu or
// Hub.streamsMu (never both), then a Stream's mu; the window's and the
// probe's locks are taken alone. It reads the log through a Reader and
// reports through a Sink, and never calls back into its caller under a
// lock, except for the subscriber callbacks it is given.
package live

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/replayd/replayd/storage"
)

// A Reader is the part of the log live delivery reads: the head, and pages
// of rows (see storage.Store).
type Reader interface {
	Head(ctx context.Context) (int64, error)
	Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error)
}

// A Sink receives live delivery's counts. Its methods are called under the
// hub's locks, on the delivering goroutine: they must be quick and must not
// call into the Hub.
type Sink interface {
	// FramesQueued counts frames queued on streams, once per dispatch.
	FramesQueued(n uint64)
	// SlowConsumerCut counts a stream ended for passing its cap.
	SlowConsumerCut()
}

// Config is what a Hub needs.
type Config struct {
	// Position is the live position to start from: the log's head.
	Position int64
	// Log is read to catch up with rows other processes committed, and
	// for the head when a delivery finds rows below the position.
	Log Reader
	// ProbeLog is read by the poll window's head probe (probe.go): the
	// hub's version takes a read slot first.
	ProbeLog Reader
	Sink     Sink
	Logger   *slog.Logger // nil: discard
	// WindowEvents and WindowBytes bound the poll window (PollOptions'
	// MemoryEvents and MemoryBytes); 0: WindowEvents and WindowBytes;
	// negative: no window.
	WindowEvents, WindowBytes int
	// EncodesAsIs reports whether a payload needs no check nor rewriting
	// in a poll answer; found once per row in the window (see asIsAt).
	// nil: never.
	EncodesAsIs func(payload []byte) bool
}

// Hub is a hub's live delivery. Create one with New.
type Hub struct {
	log, probeLog Reader
	sink          Sink
	logger        *slog.Logger
	encodesAsIs   func([]byte) bool

	// catchMu orders deliveries: it is held by whoever delivers (the
	// writer's Deliver, the tail's) for the whole of a delivery, the
	// log reads of a catch-up included, and by whoever moves pos. The reads
	// are made without mu, so a slow read stalls only the next delivery,
	// never a stream registering or a subscriber callback's caller.
	catchMu sync.Mutex
	// mu guards pos, newestAt and pending and is held while rows are
	// dispatched: user callbacks run under it. pos moves only under both
	// locks.
	mu  sync.Mutex
	pos int64 // the highest sequence delivered live
	// reported is the end of the last pruned hole catchUp reported: rows
	// deleted at or below it were named by that gap (retention per topic
	// leaves other topics' rows in a hole, which are delivered after it).
	// Guarded by catchMu and mu, as pos.
	reported int64
	// newestAt is the CreatedAt of the newest row dispatched: the tail
	// resets it before a delivery and reads its lag from it after.
	newestAt time.Time
	// pending counts frames queued since the last flush to the sink: an
	// atomic add per frame and connection measured ~5 ns, a fifth of a
	// delivery, so frames are counted once per dispatch.
	pending uint64

	// subsMu guards the subscriber sets. A subscriber registered under it
	// gets every row dispatched after that moment; every row dispatched
	// before was committed before, so a head read afterwards covers it.
	subsMu  sync.Mutex
	byTopic map[string]map[*Stream]struct{} // "" = global connections
	funcs   []*funcSub                      // copy on write
	waiters map[string]map[*Waiter]struct{} // waiting long polls; "" = global

	// streamsMu guards open, every stream a resync or Close ends (from
	// Track to Untrack, subscribed or not yet), and closed.
	streamsMu sync.Mutex
	open      map[*Stream]struct{}
	closed    bool

	// window holds the newest rows dispatched, to answer polls near the
	// head (window.go); probe shares those polls' reads of the head.
	window window
	probe  headProbe
}

// New returns a Hub at cfg.Position.
func New(cfg Config) *Hub {
	h := &Hub{
		log:         cfg.Log,
		probeLog:    cfg.ProbeLog,
		sink:        cfg.Sink,
		logger:      cfg.Logger,
		encodesAsIs: cfg.EncodesAsIs,
		pos:         cfg.Position,
		byTopic:     make(map[string]map[*Stream]struct{}),
		waiters:     make(map[string]map[*Waiter]struct{}),
		open:        make(map[*Stream]struct{}),
	}
	if h.sink == nil {
		h.sink = nopSink{}
	}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	if h.encodesAsIs == nil {
		h.encodesAsIs = func([]byte) bool { return false }
	}
	h.window.limit(cfg.WindowEvents, cfg.WindowBytes)
	return h
}

type nopSink struct{}

func (nopSink) FramesQueued(uint64) {}
func (nopSink) SlowConsumerCut()    {}

// maxSequence is above every sequence: a read after it finds only the
// head and the watermark.
const maxSequence = math.MaxInt64

// Position returns the live position. Under catchMu it stays put until
// the caller moves it.
func (h *Hub) Position() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pos
}

// Gap reasons, the root package's GapPruned, GapUnreadable and
// GapUnknownCursor (documented there).
const (
	GapPruned        = "pruned"
	GapUnreadable    = "unreadable"
	GapUnknownCursor = "unknown_cursor"
)

// A Gap is a range of rows that will not be delivered live: the root
// package's Gap, which documents it and converts from it.
type Gap struct {
	Reason        string
	After         int64
	From, Through int64
}
