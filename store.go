package replayd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/replayd/replayd/storage"
	"io"
	"time"
)

// The storage contract lives in package storage (the manner of
// database/sql/driver), so that a backend depends on it alone; these aliases
// are the same types under the names applications use.
type (
	// Store is the durable, append-only log behind an EventHub: see
	// [storage.Store] for every promise a backend keeps. [New] uses the
	// SQLite store ([NewSQLiteStore]); [NewWithStore] takes any other, such
	// as the PostgreSQL store of the module
	// github.com/replayd/replayd/replaydpg.
	Store = storage.Store
	// Event is one published event as stored in the log.
	Event = storage.Event
	// AppendResult is the outcome of one event of a Store's Append.
	AppendResult = storage.AppendResult
	// ReadRequest selects the events a Store's Read returns.
	ReadRequest = storage.ReadRequest
	// Page is a Store's Read answer, read in one snapshot.
	Page = storage.Page
	// Window is a Store's Window answer, read in one snapshot.
	Window = storage.Window
	// Span describes the retained events of a scope in a range.
	Span = storage.Span
	// Notifier is an optional Store capability: appends can be waited for
	// ([EventHub.StartTail] uses it).
	Notifier = storage.Notifier
	// SchemaEnsurer is an optional Store capability: it creates its schema
	// ([EventHub.EnsureSchema] calls it).
	SchemaEnsurer = storage.SchemaEnsurer
	// WriteProber is an optional Store capability: it checks it could
	// write ([EventHub.Ready] calls it).
	WriteProber = storage.WriteProber
	// RetentionPolicy bounds the log. Zero fields are no limit: MaxEvents
	// keeps at most that many newest events of the whole log (not per
	// topic), MaxAge deletes events older than that.
	RetentionPolicy = storage.RetentionPolicy
)

var (
	// ErrInvalid is wrapped by every error that rejects bad input to
	// Publish, Replay or the log's reads; nothing was stored. Test with
	// errors.Is.
	ErrInvalid = storage.ErrInvalid
	// ErrOutcomeUnknown, wrapped, is returned by a Publish that stopped
	// waiting while its event was being committed: the event may or may not
	// be stored (and delivered). WithEventID makes the retry safe:
	// publishing the same id again stores nothing if the first attempt was
	// committed, and returns the original event.
	ErrOutcomeUnknown = storage.ErrOutcomeUnknown
)

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
func readDefaults(r ReadRequest) ReadRequest {
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
