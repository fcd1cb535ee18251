package replayd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// The storage contract lives in package storage (the manner of
// database/sql/driver), so that a backend depends on it alone; these aliases
// are the same types under the names applications use. What only a
// backend's author needs (ReadRequest, Page, Window, Span, and the optional
// capabilities such as Notifier and TxAppender) is named in package storage
// alone.
type (
	// Store is the durable, append-only log behind an EventHub: see
	// [storage.Store] for every promise a backend keeps. [New] uses the
	// SQLite store ([NewSQLiteStore]); [NewWithStore] takes any other, such
	// as the PostgreSQL store of the module
	// github.com/replayd/replayd/replaydpg.
	Store = storage.Store
	// Event is one published event as stored in the log.
	Event = storage.Event
	// AppendResult is the outcome of one event of a Store's Append, and of
	// PublishBatch.
	AppendResult = storage.AppendResult
	// RetentionPolicy bounds the log. Zero fields are no limit: MaxEvents
	// keeps at most that many newest events of the whole log (not per
	// topic), MaxAge deletes events older than that; Topics gives topics
	// policies of their own (first match wins), the default then bounding
	// the rest.
	RetentionPolicy = storage.RetentionPolicy
	// TopicPolicy is the retention of the topics it matches: an exact
	// name, or a prefix followed by "*".
	TopicPolicy = storage.TopicPolicy
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

// NewSQLiteStore returns the SQLite store over db (see [OpenDB]):
// sqlitestore.Open with no logger. It creates the schema if it is missing
// and raises the sequence floor (see Store). It takes one connection of
// db's pool for its appends and keeps it (a pool of one, as for ":memory:",
// is lent to it per batch instead): close it when done, after any hub over
// it, through io.Closer (s.(io.Closer).Close()); it never closes db. Writes
// after Close fail; reads keep working while db is open. It implements
// [Store] and storage's SchemaEnsurer, WriteProber, TxAppender, Counter and
// PromptAppender; several stores, in one process or several, may share one
// database file. Behind New, the hub
// closes it.
func NewSQLiteStore(db *sql.DB) (Store, error) {
	s, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// OpenDB opens a SQLite database for a hub with modernc.org/sqlite (pure
// Go, no cgo): "events.db", "file:events.db?…" or ":memory:". See
// sqlitestore.OpenDB: a file gets WAL, a busy timeout of 10s,
// synchronous=NORMAL and a pool of a few connections; ":memory:" is one
// database shared by a pool of one connection. Close the *sql.DB when you
// are done; the hub never does.
func OpenDB(dsn string) (*sql.DB, error) { return sqlitestore.OpenDB(dsn) }

// ErrLogReplaced is wrapped by the error of every Publish after the hub's
// SQLite store found that the database file at its path is no longer the
// one it opened: the file was deleted, or another file was moved over it.
// Nothing was stored; the hub will not recover: close it and the *sql.DB,
// put the right file in place, and open both again. A backup restored into
// the same file through SQLite (sqlite3's ".restore") is not an error: the
// hub goes on publishing, above every sequence the lost history issued
// (docs/restore.md, "A log replaced under a running hub").
var ErrLogReplaced = sqlitestore.ErrLogReplaced

// NewWithStore returns a hub over s. The hub never closes s: the caller
// owns it and closes it after the hub. Rows already in the log are never
// delivered live; clients get them by replay. If s is a [storage.SchemaEnsurer],
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
		store:   s,
		owned:   owned,
		logger:  opts.Logger,
		clients: newTopicClientTracker(),
		queue:   newPubQueue(),
		done:    make(chan struct{}),
	}
	h.log = &EventLog{store: s}
	if pa, ok := s.(storage.PromptAppender); ok {
		h.alone = pa.AppendsPromptly()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if owned == nil { // New's SQLite store made its schema already
		if err := h.EnsureSchema(ctx); err != nil {
			return nil, err
		}
	}
	head, err := s.Head(ctx)
	if err != nil {
		return nil, fmt.Errorf("replayd: new: %w", err)
	}
	h.live = h.newLive(head)
	pool := 0
	if ps, ok := s.(storage.PoolSizer); ok {
		pool = ps.PoolSize()
	}
	h.handshakes = make(chan struct{}, handshakeSlots(pool))
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.writeCtx, h.writeCancel = context.WithCancel(context.Background())
	h.abandoned = make(chan struct{})
	h.wg.Add(1)
	go h.writeLoop()
	return h, nil
}
