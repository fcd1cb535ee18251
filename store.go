package replayd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"time"
)

// Store is the durable, append-only log behind an EventHub: the contract
// between the hub and a storage backend. [New] uses the SQLite store
// ([NewSQLiteStore]); [NewWithStore] takes any other, such as the
// PostgreSQL store of the module github.com/replayd/replayd/replaydpg. The
// package github.com/replayd/replayd/storetest turns every promise below
// into tests a backend runs against itself.
//
// # Sequence order is visibility order
//
// The rule everything else rests on: once any reader has seen an event with
// sequence s, or read the head as s, no event with a sequence <= s may become
// visible later, to any reader of the log, in any process. A reader that has
// read everything visible up to s never needs to look at or below s again:
// that is why a client's cursor can be a single number, and why a hub that
// delivered up to s live can read "above s" to catch up. SQLite's single
// writer gives it for free. A backend that assigns sequences before commit
// (an identity or serial column, say) must serialise "assign and commit",
// or readers skip rows that commit late.
//
// # Sequences and the head
//
// Append gives every stored event a sequence: a positive integer, unique in
// the log across every process and machine appending to it, larger than
// every sequence assigned before it, and never reused. Sequences need not be
// contiguous (a refused duplicate may spend one, and so does the floor
// below): the hub never does arithmetic on them, it counts visible events.
// The head is the highest sequence ever assigned or skipped; it never goes
// backwards, even after Prune deletes every event. CreatedAt, taken inside
// the write with at least millisecond precision, never decreases as the
// sequence grows, even when a clock steps back.
//
// # Log identity: the sequence floor
//
// No sequence is ever issued twice by a log, across restores from a
// backup, rebuilds and restarts, and a cursor the log never issued is
// recognised. Whoever opens a log (the constructor of the
// store: [NewSQLiteStore], replaydpg.Open) raises its head, in one write
// atomic with respect to appends, to the clock in Unix microseconds, F, if
// the head is below it, and records the range skipped: the sequences
// strictly between the old head and F were never issued. So the head of a
// new log is not 0 once it was opened, and a restored copy of a log,
// opened after the original went on, starts above every sequence the
// original issued since the backup, as long as the clock does not step
// back across opens and the log issued fewer than 1,000,000 sequences a
// second on average since its last open. A cursor above the head, or
// strictly inside a skipped range, is foreign: Window and Read report it,
// and the hub answers it with an unknown_cursor gap and goes on from the
// head. 0, the head, and every sequence the log issued are never foreign.
// A recorded range that ends above the head (the log was reset from outside
// below it) no longer describes the log and is ignored.
//
// Why a floor and not an id that names its log or event (an epoch, a
// check of the event in the id): ids stay plain decimals, so nothing on the
// wire changes; every client (EventSource, the browser module, Go clients)
// keeps comparing ids as numbers, and bare cursors stored by clients keep
// working. A client whose cursor is at or below the backup point is served
// without an unneeded gap, since the two histories agree there. A check in
// the id could not check a hello cursor (the head is often no event of the
// scope, or no row at all) nor a pruned row. The cost is one index probe
// in a tiny table, folded into the statement that reads the head. Not
// covered: two diverging copies of a log both kept running (each issues
// sequences the other also issues).
//
// # Scopes
//
// A scope is a list of distinct, non-empty topics. The empty (or nil) scope
// is global: every event is visible to it. Otherwise an event is visible
// when it is a broadcast (Topic "") or its topic is in the list. The hub
// validates topics (see Publish) before any call.
//
// # Retention and watermarks
//
// Events are only ever deleted by Prune, and only as a prefix of the log
// (the oldest, by sequence). In the same atomic step as each delete, Prune
// records for each topic it deleted from (broadcasts count as the topic "")
// the highest sequence it deleted: that topic's prune watermark, which never
// goes down. The watermark of a scope is the highest of its topics' and the
// broadcasts', or of every topic for the global scope. So a reader that finds
// a scope's watermark not above its cursor knows that nothing of the scope
// above the cursor was deleted before its read.
//
// # Calls, concurrency, errors
//
// Every method may be called concurrently with every other, Append
// included, from any number of goroutines, hubs and processes sharing the
// log (a hub appends from one goroutine, its group-commit writer, but other
// hubs append to the same log at once). A store serialises its own writes
// as it needs to; it must not call back into the hub, which owns every lock
// and goroutine of delivery: a store only answers calls.
//
// A read (Head, Read, Window, Count) describes one consistent snapshot of
// the log: every field of one answer is true of the log at one moment, a
// moment between the call and its return. A method that returns an error had
// no effect, with two exceptions: Prune reports the events it deleted before
// the error (each batch of it is atomic); and Append, when its ctx ends or
// its connection breaks after the batch was sent, may have committed the
// whole batch: its error then wraps [ErrOutcomeUnknown] (which Publish
// passes on), and appending the same event ids again returns the stored
// originals as duplicates. Methods return promptly once ctx is done.
//
// A store is closed by whoever created it: [NewWithStore] never closes the
// store it is given, and a hub made by [New] closes only the SQLite store it
// made itself, never the *sql.DB.
type Store interface {
	// Append stores evs as one atomic batch, in order: each stored event
	// gets the next sequence and a CreatedAt (the same for the whole batch
	// is fine). It returns one result per event, in the same order.
	// Sequence and CreatedAt of evs are ignored.
	//
	// An event whose EventID is already stored, earlier or earlier in the
	// same batch, is not stored again: its result is the stored original
	// with Duplicate set. An event the backend refuses on its own (text
	// PostgreSQL cannot store, a trigger's RAISE) gets Err, wrapping
	// ErrInvalid where the event itself is at fault, and is not stored; the
	// other events of the batch are stored. On return without error, every
	// event without Err is durably committed and visible to every reader.
	// A non-nil error means nothing of the batch was stored (but see the
	// type's doc for an ended ctx or a broken connection).
	Append(ctx context.Context, evs []Event) ([]AppendResult, error)

	// Head returns the head: the highest sequence ever assigned or
	// skipped (0 for a log never opened: see the sequence floor). The hub
	// calls it often (every tail poll): it should be one small read.
	Head(ctx context.Context) (int64, error)

	// Read returns, in one snapshot, the oldest events visible to req.Scope
	// with a sequence in (req.After, req.Through] (Through 0: no upper
	// bound), ascending: at most req.Limit of them, and no more once they
	// hold req.MaxBytes bytes of payload, but at least one if any is
	// there. With them come whether more such events exist, the head, the
	// scope's watermark, and whether req.After is a foreign cursor (see the
	// sequence floor). The hub reads replay pages, catch-up pages and
	// poll answers through it.
	Read(ctx context.Context, req ReadRequest) (Page, error)

	// Window returns, in one snapshot, what a client resuming from cursor
	// (>= 0) in scope needs before its replay: the head; where the replay
	// window starts (the window is the newest min(|V|, limit) events of V,
	// the scope's events above cursor, none when limit <= 0); the span of V
	// below that window (what the client missed and is told in a gap); and
	// the scope's watermark. From-1 is at or above the cursor, the
	// watermark and every skipped event, so that reading the window is
	// reading the scope above From-1 (see Window). It reports whether the
	// cursor is foreign (see the sequence floor). With cursor >= head, or a
	// foreign cursor, only Head and Foreign are meaningful.
	//
	// It reads no payload, and its cost must not grow with the number of
	// events above cursor: a hostile client would otherwise buy a full scan
	// with one request.
	Window(ctx context.Context, scope []string, cursor int64, limit int) (Window, error)

	// Count returns how many events visible to scope are retained with a
	// sequence strictly between after and before. Like Window its cost
	// should not grow with the count.
	Count(ctx context.Context, scope []string, after, before int64) (int64, error)

	// Prune deletes the events policy condemns (see RetentionPolicy: all
	// but the newest MaxEvents, and those whose CreatedAt is older than
	// MaxAge), recording watermarks as the type's doc says, in bounded
	// batches so that a large prune never blocks appends for long. It
	// returns how many events it deleted, also when it returns an error part
	// way. Several hubs may prune one log at once; each counts only what it
	// deleted.
	Prune(ctx context.Context, policy RetentionPolicy) (int64, error)
}

// AppendResult is the outcome of one event of a [Store.Append].
type AppendResult struct {
	// Event is the stored event: the one given with its Sequence and
	// CreatedAt set, or, for a duplicate, the original stored under its
	// event id. With Err set it is the event given, unchanged.
	Event Event
	// Duplicate reports that the event id was stored already (or came
	// earlier in the same batch): nothing was stored for this event.
	Duplicate bool
	// Err, when set, refused this event alone; nothing was stored for it.
	Err error
}

// ReadRequest selects the events [Store.Read] returns.
type ReadRequest struct {
	Scope    []string // topics; empty: every event
	After    int64    // only events with a sequence above this
	Through  int64    // and at or below this; 0: no upper bound
	Limit    int      // at most this many events; <= 0: 100
	MaxBytes int      // no more events once they hold this many payload bytes (at least one); <= 0: no bound
}

// Page is [Store.Read]'s answer, read in one snapshot.
type Page struct {
	Events    []Event // ascending
	More      bool    // more events of the scope exist in (the last returned, Through]
	Head      int64   // the head
	Watermark int64   // the scope's prune watermark
	Foreign   bool    // After is foreign: above Head, or inside a skipped range (see the sequence floor)
}

// Window is [Store.Window]'s answer, read in one snapshot.
type Window struct {
	Head      int64
	From      int64 // the replay window is the scope's events in [From, Head]; Head+1 when it is empty
	Skipped   Span  // the scope's retained events above the cursor and below From
	Watermark int64 // the scope's prune watermark
	Foreign   bool  // the cursor is foreign: above Head, or inside a skipped range (see the sequence floor)
}

// Span describes the retained events of a scope in a range: how many, and
// the first and last sequence (both 0 when Count is 0).
type Span struct{ Count, First, Last int64 }

// Notifier is an optional [Store] capability: a store whose appends, from
// any process, can be waited for. A tailing hub ([EventHub.StartTail]) uses
// it to learn of other processes' rows at once, polling at its interval
// only as a fallback.
type Notifier interface {
	// WaitForAppend returns nil once the head may be above after: at once
	// if it is known to be, else when an append above after is committed.
	// It may return nil spuriously, and may miss an append (the hub's
	// fallback poll covers that), but should not, and must return ctx's
	// error promptly once ctx ends.
	WaitForAppend(ctx context.Context, after int64) error
}

// SchemaEnsurer is an optional [Store] capability: a store that can create
// its schema when it is missing. [EventHub.EnsureSchema] calls it; for a
// store without it, EnsureSchema does nothing. It is safe to call again and
// from several processes at once.
type SchemaEnsurer interface {
	EnsureSchema(ctx context.Context) error
}

// WriteProber is an optional [Store] capability: a store that can check it
// could write now, without writing anything. [EventHub.Ready] calls it after
// reading the head; for a store without it, Ready only reads the head.
type WriteProber interface {
	ProbeWrite(ctx context.Context) error
}

// NewSQLiteStore returns the SQLite store over db (see [OpenDB]), creating
// the schema if it is missing and raising the sequence floor (see Store). It takes one connection of db's pool for its
// appends and keeps it (a pool of one, as for ":memory:", is lent to it per
// batch instead): close it when done, after any hub over it, through
// io.Closer (s.(io.Closer).Close()); it never closes db. Writes after Close
// fail; reads keep working while db is open. It implements [Store],
// [SchemaEnsurer] and [WriteProber]; several stores, in one process or
// several, may share one database file. Behind New, the hub closes it.
func NewSQLiteStore(db *sql.DB) (Store, error) {
	s, err := openSQLiteStore(db, nil)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NewWithStore returns a hub over s. The hub never closes s: the caller
// owns it and closes it after the hub. Rows already in the log are never
// delivered live; clients get them by replay. If s is a [SchemaEnsurer],
// the schema is created first.
func NewWithStore(s Store, opts Options) (*EventHub, error) {
	if s == nil {
		return nil, errors.New("replayd: new: nil Store")
	}
	return newHub(s, opts, nil)
}

// newHub makes the hub over s; owned, if not nil, is closed by the hub's
// Close (and by a failing newHub).
func newHub(s Store, opts Options, owned io.Closer) (h *EventHub, err error) {
	defer func() {
		if err != nil && owned != nil {
			owned.Close()
		}
	}()
	opts, err = opts.withDefaults()
	if err != nil {
		return nil, err
	}
	h = &EventHub{
		opts:    opts,
		store:   hubStore{s},
		owned:   owned,
		logger:  opts.Logger,
		clients: newTopicClientTracker(),
		pubs:    make(chan *publishReq),
		done:    make(chan struct{}),
		streams: make(map[*stream]struct{}),
	}
	h.log = &EventLog{store: s}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if owned == nil { // New's SQLite store made its schema already
		if err := h.EnsureSchema(ctx); err != nil {
			return nil, err
		}
	}
	if h.live.pos, err = s.Head(ctx); err != nil {
		return nil, fmt.Errorf("replayd: new: %w", err)
	}
	slots := 8
	if sq, ok := s.(*sqliteStore); ok {
		h.file = sq.file
		slots = handshakeSlots(sq.db.Stats().MaxOpenConnections)
	}
	h.handshakes = make(chan struct{}, slots)
	h.live.init()
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.writeCtx, h.writeCancel = context.WithCancel(context.Background())
	h.abandoned = make(chan struct{})
	h.wg.Add(1)
	go h.writeLoop()
	return h, nil
}

// hubStore is the hub's view of its Store: the reads and writes the hub
// makes, in the hub's terms.
type hubStore struct{ s Store }

func (v hubStore) latestSequence(ctx context.Context) (int64, error) { return v.s.Head(ctx) }

// readHandshake reads the head and, for a cursor >= 0 below it, the window
// (see Store.Window). A negative cursor means a fresh client: only the
// head is read.
func (v hubStore) readHandshake(ctx context.Context, topics []string, cursor int64, limit int) (handshake, error) {
	if cursor < 0 {
		head, err := v.s.Head(ctx)
		return handshake{head: head}, err
	}
	w, err := v.s.Window(ctx, topics, cursor, limit)
	if err != nil {
		return handshake{}, err
	}
	return handshake{
		head:      w.Head,
		foreign:   w.Foreign,
		from:      w.From,
		skipped:   span{count: w.Skipped.Count, first: w.Skipped.First, last: w.Skipped.Last},
		watermark: w.Watermark,
	}, nil
}

// readPage returns the oldest events of scope in (after, through], at most
// maxEvents of them and no more once they hold maxBytes of payload (at least
// one), and the scope's prune watermark of the same snapshot. If the
// watermark is not above after, no event of the scope in (after, through]
// was missing when the page was read: the page is every such event up to
// its last.
func (v hubStore) readPage(ctx context.Context, topics []string, after, through int64, maxEvents, maxBytes int) ([]Event, int64, error) {
	p, err := v.s.Read(ctx, ReadRequest{Scope: topics, After: after, Through: through, Limit: maxEvents, MaxBytes: maxBytes})
	return p.Events, p.Watermark, err
}

// page is what read returns: a scope's oldest events above a cursor, with
// the head and the scope's watermark, read in one snapshot.
type page struct {
	events    []Event // ascending
	more      bool    // more visible events existed above the last one
	head      int64
	watermark int64
	foreign   bool // after is foreign to the log
}

// read returns, in one snapshot (Store.Read), the head, the scope's prune
// watermark and its oldest events above after: at most limit of them, no
// more once they hold maxBytes of payload (at least one), and whether there
// were more. The poll handler answers from it; everything in
// one answer describes the log at one moment, so a prune racing the read
// cannot open a hole between the events and the watermark.
func (v hubStore) read(ctx context.Context, topics []string, after int64, limit, maxBytes int) (page, error) {
	p, err := v.s.Read(ctx, ReadRequest{Scope: topics, After: after, Limit: limit, MaxBytes: maxBytes})
	if err != nil {
		return page{}, err
	}
	return page{events: p.Events, more: p.More, head: p.Head, watermark: p.Watermark, foreign: p.Foreign}, nil
}

// withDefaults fills in ReadRequest's zero values.
func (r ReadRequest) withDefaults() ReadRequest {
	if r.Limit <= 0 {
		r.Limit = 100
	}
	if r.Through <= 0 {
		r.Through = maxSequence
	}
	if r.MaxBytes <= 0 {
		r.MaxBytes = maxInt
	}
	return r
}

const maxInt = int(^uint(0) >> 1)
