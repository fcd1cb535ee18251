// Package storage is the contract between a replayd hub and the durable
// log behind it, in the manner of database/sql/driver: the [Store]
// interface, its optional capabilities ([Notifier], [SchemaEnsurer],
// [WriteProber], [PoolSizer], [PromptAppender], [TxAppender], [Counter],
// [TopicPruner]),
// and the values that cross it. A backend imports only this package.
// Applications name the few types they meet (Store, Event, AppendResult,
// RetentionPolicy) through their aliases in package replayd, which are the
// same types; the rest are named here only.
//
// The SQLite store (package github.com/replayd/replayd/sqlitestore) and the
// PostgreSQL store (module github.com/replayd/replayd/replaydpg) implement
// it; package github.com/replayd/replayd/storetest turns every promise
// below into tests a backend runs against itself.
package storage

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Event is one published event as stored in the log.
type Event struct {
	Sequence  int64           // the row's sequence: the SSE id
	EventID   string          // idempotency key; a UUIDv7 unless given
	Type      string          // the SSE event type
	Topic     string          // "" = broadcast
	Payload   json.RawMessage // the JSON sent as the SSE data
	CreatedAt time.Time       // commit time, millisecond precision
}

// RetentionPolicy bounds the log. Zero fields are no limit.
//
// Without Topics, MaxEvents and MaxAge bound the whole log. With Topics,
// a topic that an entry of Topics matches is pruned by the first entry that
// matches it (first match wins, in the order given) and by nothing else,
// and MaxEvents and MaxAge bound the rest of the log: the broadcasts and
// the events of every topic no entry matches (MaxEvents then counts those
// events only). So an audit topic can be kept for a month while the
// default keeps a day, and a chatty feed for minutes. See
// docs/operations.md, "Retention per topic".
type RetentionPolicy struct {
	MaxEvents int64         // keep at most this many newest events of the whole log (not per topic; with Topics: of the events no entry matches); 0: no count limit
	MaxAge    time.Duration // delete events older than this; 0: no age limit
	// Topics are per-topic policies, first match wins; nil: none.
	Topics []TopicPolicy
}

// TopicPolicy is the retention of the topics it matches (see
// [RetentionPolicy]). Zero limits are no limit: a TopicPolicy with
// neither keeps its topics' events for ever, whatever the default.
type TopicPolicy struct {
	// Topic is an exact topic name, or a prefix followed by "*", which
	// matches every topic that starts with the prefix ("*" alone: every
	// topic). "*" may only end it, the syntax of replayd serve's publish-key
	// and token patterns. It never matches broadcasts, which the default
	// governs.
	Topic     string
	MaxEvents int64         // keep at most this many newest events of each topic it matches; 0: no count limit
	MaxAge    time.Duration // delete its topics' events older than this; 0: no age limit
}

// Match reports whether p's Topic covers topic ("" is a broadcast, and
// never matched).
func (p TopicPolicy) Match(topic string) bool {
	if topic == "" {
		return false
	}
	if prefix, ok := strings.CutSuffix(p.Topic, "*"); ok {
		return strings.HasPrefix(topic, prefix)
	}
	return topic == p.Topic
}

// For returns the entry of Topics that governs topic: the first that
// matches it, and false when none does (the default governs it, as it
// does broadcasts).
func (p RetentionPolicy) For(topic string) (TopicPolicy, bool) {
	for _, tp := range p.Topics {
		if tp.Match(topic) {
			return tp, true
		}
	}
	return TopicPolicy{}, false
}

// IsZero reports whether p deletes nothing: no limit of the default and no
// entry of Topics. (A RetentionPolicy holds a slice, so it cannot be
// compared with ==.)
func (p RetentionPolicy) IsZero() bool {
	return p.MaxEvents <= 0 && p.MaxAge <= 0 && len(p.Topics) == 0
}

// Validate reports a policy a store must refuse, wrapping [ErrInvalid]: an
// entry of Topics whose Topic is empty or has a "*" anywhere but at its
// end, or whose limits are negative. (A negative MaxEvents or MaxAge of
// the default is no limit, as it always was.)
func (p RetentionPolicy) Validate() error {
	for _, tp := range p.Topics {
		switch {
		case tp.Topic == "":
			return fmt.Errorf("%w: retention: a topic policy without a topic", ErrInvalid)
		case strings.Contains(strings.TrimSuffix(tp.Topic, "*"), "*"):
			return fmt.Errorf("%w: retention: topic pattern %q: * may only end a pattern", ErrInvalid, tp.Topic)
		case tp.MaxEvents < 0 || tp.MaxAge < 0:
			return fmt.Errorf("%w: retention: topic %q: negative limit", ErrInvalid, tp.Topic)
		}
	}
	return nil
}

// ErrInvalid is wrapped by every error that rejects bad input to Publish,
// Replay or the log's reads; nothing was stored. Test with errors.Is. A
// store wraps it in an [AppendResult.Err] for an event it refuses on its
// own (text its database cannot store, say).
var ErrInvalid = errors.New("invalid input")

// ErrOutcomeUnknown, wrapped, is returned by a Publish that stopped waiting
// while its event was being committed: the event may or may not be stored
// (and delivered). WithEventID makes the retry safe: publishing the same id
// again stores nothing if the first attempt was committed, and returns the
// original event. A store's Append wraps it when it cannot tell whether it
// committed (see [Store]).
var ErrOutcomeUnknown = errors.New("replayd: outcome unknown: the event may or may not be stored")

// Store is the durable, append-only log behind a replayd.EventHub: the
// contract between the hub and a storage backend. replayd.New uses the
// SQLite store (package github.com/replayd/replayd/sqlitestore);
// replayd.NewWithStore takes any other, such as the
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
// store: sqlitestore.Open, replaydpg.Open) raises its head, in one write
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
// A log replaced under a running store (restored in place, its tables
// emptied and refilled from outside) is not opened again, and its head is
// the backup's. So a store remembers the highest sequence it knows its log
// issued (its appends, the heads it read) and, in the write that appends,
// before any row takes a sequence, finds a head below that sequence a
// replaced log: it raises the floor there as an open would (to the clock,
// or to that sequence if the clock is behind), so the lost history's
// sequences are foreign and none is issued twice. The hub, finding its
// live position foreign (Read's Foreign for the live catch-up), ends its
// streams and tells gap subscribers, as for a head below the position.
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
// Events are only ever deleted by Prune (and a [TopicPruner]'s
// PruneTopic), and, for each topic, only as a prefix of that topic's
// events (the oldest, by sequence; broadcasts count as the topic ""). A
// policy without Topics deletes a prefix of the whole log, which is that;
// per-topic policies delete a prefix of each topic, so the retained events
// of a busy topic and those of a quiet one may interleave with the holes
// retention left. In the same atomic step as each delete, the store
// records for each topic it deleted from the highest sequence it deleted:
// that topic's prune watermark, which never goes down. So every event of a
// topic at or below its watermark is deleted, and every retained one is
// above it.
//
// The watermark of a scope is the highest of its topics' and the
// broadcasts', or of every topic for the global scope. A reader that finds
// it not above its cursor knows that nothing of the scope above the cursor
// was deleted before its read. A reader that finds it above the cursor, P,
// knows that the scope lost events above the cursor (the one at P at
// least), and none above P: the range (cursor, P] names exactly where the
// scope lost events. Events of the scope retained inside that range (of
// topics pruned less, or never) are still there and still read: Read
// returns them and Window's replay window includes them, so that a client
// told of the range is still sent what was kept (the hub sends a pruned gap
// naming the range, then those events; see replayd's PROTOCOL.md, "gap").
//
// A store numbers rows to count them by index (sqlitestore's ordinals,
// replaydpg's): per-topic numbering stays without holes, since each topic
// loses only a prefix; a numbering of the whole log does not once topics
// are pruned apart, which is why Window's Skipped.Count is promised exact
// only when the scope's watermark is not above the cursor (below, the hub
// counts nothing: a pruned gap's missed is null).
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
// A read (Head, Read, Window, and a [Counter]'s Count) describes one
// consistent snapshot of the log: every field of one answer is true of the log at one moment, a
// moment between the call and its return. A method that returns an error had
// no effect, with two exceptions: Prune reports the events it deleted before
// the error (each batch of it is atomic); and Append, when its ctx ends or
// its connection breaks after the batch was sent, may have committed the
// whole batch: its error then wraps [ErrOutcomeUnknown] (which the hub's Publish
// passes on), and appending the same event ids again returns the stored
// originals as duplicates. Methods return promptly once ctx is done.
//
// A store is closed by whoever created it: replayd.NewWithStore never closes
// the store it is given, and a hub made by replayd.New closes only the SQLite store it
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
	// the scope's watermark. From-1 is at or above the cursor and every
	// skipped event, so that reading the window is reading the scope above
	// From-1 (see Window); it may be below the watermark, whose range may
	// hold retained events of topics pruned less (see the type's doc,
	// Retention and watermarks): they are in the window. It reports whether the
	// cursor is foreign (see the sequence floor). With cursor >= head, or a
	// foreign cursor, only Head and Foreign are meaningful.
	//
	// It reads no payload, and its cost must not grow with the number of
	// events above cursor: a hostile client would otherwise buy a full scan
	// with one request.
	Window(ctx context.Context, scope []string, cursor int64, limit int) (Window, error)

	// Prune deletes the events policy condemns (see RetentionPolicy: all
	// but the newest MaxEvents, and those whose CreatedAt is older than
	// MaxAge, of the whole log or, with Topics, of each topic an entry
	// governs and of the rest), recording watermarks as the type's doc
	// says, in bounded batches so that a large prune never blocks appends
	// for long. An invalid policy (RetentionPolicy.Validate) deletes
	// nothing and returns its error. Events appended after the prune began
	// are never condemned by it. It
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
	Skipped   Span  // the scope's retained events above the cursor and below From; Count exact when Watermark <= cursor (see Store, Retention and watermarks)
	Watermark int64 // the scope's prune watermark: when above the cursor, the scope lost events in (cursor, Watermark] and none above
	Foreign   bool  // the cursor is foreign: above Head, or inside a skipped range (see the sequence floor)
}

// Span describes the retained events of a scope in a range: how many, and
// the first and last sequence (both 0 when Count is 0).
type Span struct{ Count, First, Last int64 }

// Notifier is an optional [Store] capability: a store whose appends, from
// any process, can be waited for. A tailing hub (replayd.EventHub.StartTail) uses
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
// its schema when it is missing. replayd.EventHub.EnsureSchema calls it; for a
// store without it, EnsureSchema does nothing. It is safe to call again and
// from several processes at once.
type SchemaEnsurer interface {
	EnsureSchema(ctx context.Context) error
}

// WriteProber is an optional [Store] capability: a store that can check it
// could write now, without writing anything. replayd.EventHub.Ready calls it after
// reading the head; for a store without it, Ready only reads the head.
type WriteProber interface {
	ProbeWrite(ctx context.Context) error
}

// PoolSizer is an optional [Store] capability: a store whose reads share a
// pool of a fixed number of connections with its appends. The hub then
// keeps its concurrent replay reads two below PoolSize, so that a storm of
// connecting clients leaves a connection for its appends and one for
// catching up on other processes' rows. 0 means no bound.
type PoolSizer interface {
	PoolSize() int
}

// TopicPruner is an optional [Store] capability: a store that deletes the
// events of one topic, the primitive per-topic retention is made of, for
// callers that decide themselves what a topic keeps (a Durable Stream's
// TTL or deletion, a job stream's retention).
type TopicPruner interface {
	// PruneTopic deletes every event of topic (not "": broadcasts are
	// pruned by Prune's default) with a sequence at or below through
	// (math.MaxInt64: all of them, so far), a prefix of the topic, in
	// bounded batches, raising the topic's watermark as Prune does. It
	// returns how many events it deleted, also when it returns an error
	// part way. Events appended after the call began are never deleted by
	// it.
	PruneTopic(ctx context.Context, topic string, through int64) (int64, error)
}

// Counter is an optional [Store] capability: a store that counts a
// scope's events in a range in one snapshot, without reading them.
// replayd.EventLog.CountBetween, its only caller, uses it; for a store
// without it, CountBetween counts the events of Read pages, in several
// snapshots.
type Counter interface {
	// Count returns how many events visible to scope are retained with a
	// sequence strictly between after and before. Like Window its cost
	// should not grow with the count.
	Count(ctx context.Context, scope []string, after, before int64) (int64, error)
}

// PromptAppender is an optional [Store] capability: a store whose Append
// keeps the promise of "Methods return promptly once ctx is done" whatever
// it waits for (a lock, a busy database, the network), and cheaply for a
// short-lived ctx. Every store should keep it, but the hub does not stake a
// publisher's return on it otherwise: its writer goroutine commits under
// the hub's own ctx and the publisher waits beside it, so a store that
// overruns its ctx delays only the writer. When AppendsPromptly reports
// true, a lone publish (no other in progress, the writer idle) commits on
// the publisher's goroutine under the publisher's ctx instead, saving the
// hand-over to the writer and back: two wake-ups, about a fifth of a
// one-event publish on SQLite.
type PromptAppender interface {
	AppendsPromptly() bool
}

// TxAppender is an optional [Store] capability: a store over a
// database/sql database with a single writer (SQLite) that appends events
// inside the application's own transaction on that database, so that they
// are in the log if and only if it commits. replayd.EventHub.InTx and
// PublishTx use it.
type TxAppender interface {
	// BeginTx begins a transaction on the store's database holding its
	// write lock (waiting for another writer within the store's busy
	// timeout).
	BeginTx(ctx context.Context) (*sql.Tx, error)
	// AppendTx stores evs in tx as Append does, visible once tx commits:
	// sequences, CreatedAt, and duplicates by event id (as tx sees the
	// log) alike. An error may leave some of evs inserted in tx: roll it
	// back. It never commits nor rolls back tx.
	AppendTx(ctx context.Context, tx *sql.Tx, evs []Event) ([]AppendResult, error)
}
