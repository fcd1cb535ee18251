package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/replayd/replayd/storage"
)

// ErrClosed is returned by a store's writes after Close.
var ErrClosed = errors.New("replayd: the store is closed")

// Options configure a SQLite store.
type Options struct {
	// Logger, if not nil, is told of a clock behind the log's head (see the
	// sequence floor in package storage), of a log replaced in place under
	// the store (its head raised), and, at Error, of a database file
	// deleted or replaced under the store.
	Logger *slog.Logger
}

// Open returns the SQLite store over db (see [OpenDB]): it creates the
// schema if it is missing, raises the sequence floor (see floor.go; a
// clock behind the head is logged), remembers the database file's
// identity, and reserves the writer's connection now, before any reader
// can queue for the pool (an append is never slowed by readers). A pool
// of one, as for ":memory:", is lent to the writer per batch instead.
//
// Close the store when done, after any hub over it; it never closes db.
// Writes after Close fail with [ErrClosed]; reads keep working while db is
// open. Several stores, in one process or several, may share one database
// file.
//
// A backup restored into the open file (sqlite3's ".restore", SQLite's
// online-backup API) keeps working: the store's next append finds the head
// below what it knows was issued, raises the floor before its rows take
// sequences, and logs it at Warn (see guardHead in floor.go, and
// docs/restore.md).
func Open(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("replayd: nil *sql.DB")
	}
	s := &Store{db: db, logger: opts.Logger}
	// No deadline for the schema: numbering the rows of an earlier
	// version's log runs once and takes about 8s a million rows; each of
	// its transactions waits for the write lock within the busy timeout.
	if err := s.EnsureSchema(context.Background()); err != nil {
		return nil, fmt.Errorf("replayd: ensure schema: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := s.raiseFloor(ctx, floorClock(), opts.Logger); err != nil {
		return nil, fmt.Errorf("replayd: raise the sequence floor: %w", err)
	}
	var err error
	if s.file, err = newFileGuard(ctx, db); err != nil {
		return nil, fmt.Errorf("replayd: new: %w", err)
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return nil, fmt.Errorf("replayd: new: %w", err)
	}
	s.wal = strings.EqualFold(mode, "wal")
	s.prepareTx(ctx) // AppendTx's statements, before any transaction needs them
	if db.Stats().MaxOpenConnections != 1 {
		s.writeMu.Lock()
		err = s.reserveWriter(ctx)
		s.writeMu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("replayd: new: %w", err)
		}
	}
	return s, nil
}

// PoolSize returns the size of db's pool (0: unbounded): the hub keeps
// its concurrent log reads below it (see storage.PoolSizer).
func (s *Store) PoolSize() int { return s.db.Stats().MaxOpenConnections }

// EnsureSchema creates the tables and index if they are missing.
func (s *Store) EnsureSchema(ctx context.Context) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.ensureSchema(ctx)
}

// Close releases the writer's connection. It waits for a write in
// progress; it never closes the *sql.DB. Writes after Close fail; reads
// keep working as long as the *sql.DB is open.
func (s *Store) Close() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.closed = true
	s.releaseWriter(false)
	if s.ckpt != nil {
		s.ckpt.stop()
	}
	s.stmts.close()
	return nil
}

// Append commits evs in one transaction (see appendBatch). A batch that
// fails on one row (a constraint, such as a trigger's RAISE, or a value too
// big) is committed again event by event, so that only that event fails:
// then every failure, of whatever kind, is its own event's Err.
//
// ctx bounds the waits: for this store's other writes (a prune batch, say),
// for another connection's write lock, and between rows; once the rows are
// sent, COMMIT runs to its end.
func (s *Store) Append(ctx context.Context, evs []storage.Event) ([]storage.AppendResult, error) {
	s.writers.Add(1)
	defer s.writers.Add(-1)
	s.appended.Store(time.Now().UnixNano())
	unlock, err := lockCtx(ctx, &s.writeMu)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if s.closed {
		return nil, ErrClosed
	}
	// A file deleted or replaced under the store: rows committed now would
	// go into a file no process opens again (or, through the old -wal,
	// corrupt the new one).
	if err := s.checkFile(false); err != nil {
		return nil, err
	}
	res := make([]storage.AppendResult, len(evs))
	batch := make([]storage.Event, len(evs))
	copy(batch, evs)
	dup := make([]bool, len(evs))
	err = s.appendBatch(ctx, batch, dup)
	switch {
	case err == nil:
	case len(evs) > 1 && rowError(err) && ctx.Err() == nil:
		for i := range evs {
			one, d := []storage.Event{evs[i]}, []bool{false}
			if err := s.appendBatch(ctx, one, d); err != nil {
				res[i] = storage.AppendResult{Event: evs[i], Err: err}
				continue
			}
			res[i] = storage.AppendResult{Event: one[0], Duplicate: d[0]}
			s.saw(one[0].Sequence)
		}
		return res, nil
	default:
		// Busy, I/O and the like fail every event alike: was it because
		// the file went away?
		if ferr := s.checkFile(true); ferr != nil {
			err = fmt.Errorf("%w (%v)", ferr, err)
		}
		return nil, err
	}
	for i := range batch {
		res[i] = storage.AppendResult{Event: batch[i], Duplicate: dup[i]}
		s.saw(batch[i].Sequence)
	}
	return res, nil
}

// AppendsPromptly reports true (storage.PromptAppender): Append waits for
// writeMu and for SQLite's write lock watching ctx (lockCtx, retryBusy),
// and looks at ctx before each row.
func (s *Store) AppendsPromptly() bool { return true }

// Head reads the head from sqlite_sequence: one indexed row. A tailing hub
// calls it every poll, so it also looks at the database file (at most once
// per fileCheckInterval) and logs a deleted or replaced one, which appends
// then refuse.
//
// It runs a prepared statement (see stmtCache): preparing it again on every
// call was a fifth of an idle tail poll's CPU. In WAL mode, where a read
// never waits for a writer, the statement runs without ctx once ctx is
// found not done: a cancellable context costs the driver and database/sql
// a goroutine each per statement, and in an idle process each wakes a
// thread, which was most of the rest.
func (s *Store) Head(ctx context.Context) (int64, error) {
	s.checkFile(false)
	if s.wal {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		ctx = context.WithoutCancel(ctx)
	}
	rows, prepared, err := s.stmts.query(ctx, s.db, qHead)
	if err != nil {
		return 0, err
	}
	var head int64
	if rows.Next() {
		err = rows.Scan(&head)
	} else if err = rows.Err(); err == nil {
		err = errors.New("replayd: read the head: no row")
	}
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	if !prepared {
		s.stmts.prepare(ctx, s.db, []string{qHead}) // now that the connection is back
	}
	s.saw(head)
	return head, nil
}

// Read reads a page in one statement, one snapshot: its first row is the
// head and the scope's watermark, the others the page (see kindPage). It
// needs no read transaction of its own, which cost a poll answer as much as
// its three queries had before they were one.
func (s *Store) Read(ctx context.Context, req storage.ReadRequest) (p storage.Page, err error) {
	req = withDefaults(req)
	query := scopeQuery(kindPage, len(req.Scope))
	// One row more than the limit tells More.
	rows, prepared, err := s.stmts.query(ctx, s.db, query, scopeArgs(req.Scope, req.After, req.Through, min(req.Limit, maxInt-1)+1)...)
	if err != nil {
		return storage.Page{}, err
	}
	err = readPage(rows, req, &p)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return storage.Page{}, err
	}
	if !prepared {
		s.stmts.prepare(ctx, s.db, []string{query}) // now that the connection is back
	}
	s.saw(p.Head)
	return p, nil
}

// readPage reads a kindPage query's rows into p.
func readPage(rows *sql.Rows, req storage.ReadRequest, p *storage.Page) error {
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return errors.New("replayd: read a page: no head row")
	}
	var eventID, unused any
	if err := rows.Scan(&p.Head, &p.Watermark, &eventID, &p.Foreign, &unused, &unused); err != nil {
		return err
	}
	if eventID != nil {
		return errors.New("replayd: read a page: an event came before the head row")
	}
	size := 0
	var sc eventScanner
	for rows.Next() {
		if len(p.Events) == req.Limit || size >= req.MaxBytes {
			p.More = true
			break
		}
		ev, err := sc.scan(rows)
		if err != nil {
			return err
		}
		if n := len(p.Events); n > 0 && ev.Sequence <= p.Events[n-1].Sequence {
			return errors.New("replayd: read a page: events out of order")
		}
		p.Events = append(p.Events, ev)
		size += len(ev.Payload)
	}
	return nil
}

// Window reads a resuming client's window (see readHandshake).
func (s *Store) Window(ctx context.Context, scope []string, cursor int64, limit int) (storage.Window, error) {
	hs, err := s.readHandshake(ctx, scope, max(cursor, 0), max(limit, 0))
	if err != nil {
		return storage.Window{}, err
	}
	s.saw(hs.Head)
	if cursor >= hs.Head || hs.Foreign {
		return storage.Window{Head: hs.Head, Foreign: hs.Foreign}, nil
	}
	return hs, nil
}

// Count counts a scope's events in (after, before) by their ordinals (see
// span), in one read transaction.
func (s *Store) Count(ctx context.Context, scope []string, after, before int64) (n int64, err error) {
	err = s.readTx(ctx, func(tx querier) error {
		sp, err := s.exactSpan(ctx, tx, scope, after, before)
		n = sp.Count
		return err
	})
	return n, err
}

// Prune deletes in batches, each its own write transaction under writeMu.
func (s *Store) Prune(ctx context.Context, policy storage.RetentionPolicy) (int64, error) {
	return s.prune(ctx, policy, func() func() {
		s.writeMu.Lock()
		return s.writeMu.Unlock
	})
}

// ProbeWrite takes and releases SQLite's write lock on the writer's
// connection, writing nothing. It queues behind this store's own writes
// (writeMu) instead of racing them for SQLite's lock, so it never stalls
// an append; ctx bounds the wait.
func (s *Store) ProbeWrite(ctx context.Context) error {
	unlock, err := lockCtx(ctx, &s.writeMu)
	if err != nil {
		return fmt.Errorf("wait for the writer: %w", err)
	}
	defer unlock()
	if s.closed {
		return ErrClosed
	}
	return s.probeWrite(ctx)
}

// readTx runs fn in one read transaction: one snapshot of the log, read
// with the store's prepared statements.
func (s *Store) readTx(ctx context.Context, fn func(querier) error) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	q := &cachedTx{c: &s.stmts, tx: tx}
	err = fn(q)
	if cerr := tx.Commit(); err == nil {
		err = cerr
	}
	if err == nil && len(q.missing) > 0 {
		s.stmts.prepare(ctx, s.db, q.missing) // now that the connection is back
	}
	return err
}

// lockCtx takes mu, or gives up when ctx ends. A lock taken after giving up
// is released at once by the goroutine that waited for it.
func lockCtx(ctx context.Context, mu *sync.Mutex) (unlock func(), err error) {
	if mu.TryLock() {
		return mu.Unlock, nil
	}
	got, abandon := make(chan struct{}), make(chan struct{})
	go func() {
		mu.Lock()
		select {
		case got <- struct{}{}:
		case <-abandon:
			mu.Unlock()
		}
	}()
	select {
	case <-got:
		return mu.Unlock, nil
	case <-ctx.Done():
		close(abandon)
		return nil, ctx.Err()
	}
}

// withDefaults fills in a ReadRequest's zero values.
func withDefaults(r storage.ReadRequest) storage.ReadRequest {
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

const (
	maxInt      = int(^uint(0) >> 1)
	maxSequence = 1<<63 - 1
)
