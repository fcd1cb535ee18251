package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/replayd/replayd/storage"
)

// Publishing inside the application's own transaction. SQLite has one
// writer per database file: a transaction that writes holds the write lock
// from its first write to its end, so rows it appends to the log get
// sequences above the head at that moment, and no other writer (this
// store's Append included, which waits for the lock like any other
// process's) can commit between them. Sequence order stays visibility
// order without anything more. The cost is that every other write to the
// file, every Publish of every process, waits for the transaction to end
// (within the busy timeout).

// qTakeWriteLock is a write that changes nothing: in a deferred
// transaction, it takes the write lock, as BEGIN IMMEDIATE would, so that
// the transaction waits for another writer now (within the busy timeout)
// instead of failing later when a read-then-write cannot be upgraded.
const qTakeWriteLock = `UPDATE events_skips SET through = through WHERE 0`

// txQueries are the statements AppendTx runs: the writer's (see
// insertRows). Open prepares them on the *sql.DB, so that AppendTx
// reuses them on the transaction's connection (Tx.StmtContext) without
// needing a second connection.
var txQueries = []string{qLastRow, qLastTopicOrdinal, qLastBroadcastOrd, qInsert, qByEventID, qTakeWriteLock}

// prepareTx prepares txQueries (errors are left to AppendTx, which then
// prepares on the transaction).
func (l *Store) prepareTx(ctx context.Context) { l.stmts.prepare(ctx, l.db, txQueries) }

// BeginTx begins a transaction on the store's database and takes SQLite's
// write lock in it at once, waiting for another writer within the busy
// timeout (see OpenDB). The application writes its own rows in it, appends
// events with AppendTx, and commits or rolls back. Until then every other
// write to the file waits, this store's appends included: keep it short,
// and never wait in it for a Publish of a hub over this store (that publish
// waits for the transaction).
func (l *Store) BeginTx(ctx context.Context) (*sql.Tx, error) {
	l.prepareTx(ctx) // between transactions: see stmtCache
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	lock, err := l.txStmt(ctx, tx, qTakeWriteLock)
	if err == nil {
		err = retryBusy(ctx, func() error {
			_, err := lock.ExecContext(ctx)
			return err
		})
		lock.Close()
	}
	if err != nil {
		tx.Rollback()
		return nil, fmt.Errorf("take the write lock: %w", err)
	}
	return tx, nil
}

// AppendTx inserts evs into the log inside tx, a transaction on the
// store's *sql.DB, with the same code as Append: each event gets the next
// sequence (above the head and every skipped range), the next ordinals,
// and a CreatedAt; an event id already stored (as tx sees the log) stores
// nothing and returns the original with Duplicate set. The rows become
// visible, to every process, when tx commits, and vanish with a rollback.
//
// It does not take the store's write mutex: tx holds SQLite's write lock
// from its first write, which the store's own Append waits for. The
// writer's cached topic ordinals stay correct, since it checks the newest
// row before using them (see insertRows). An error leaves the rows of evs
// inserted before the failing one in tx: roll it back (a single event's
// failed insert leaves tx as it was). It never commits nor rolls back tx.
func (l *Store) AppendTx(ctx context.Context, tx *sql.Tx, evs []storage.Event) ([]storage.AppendResult, error) {
	if tx == nil {
		return nil, fmt.Errorf("replayd: append in a transaction: nil *sql.Tx")
	}
	if err := l.checkFile(false); err != nil {
		return nil, err
	}
	w := &logWriter{newest: -1} // no cache: another writer may have appended
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{
		{&w.lastRow, qLastRow},
		{&w.lastTopicOrd, qLastTopicOrdinal},
		{&w.lastBroadcastOrd, qLastBroadcastOrd},
		{&w.insert, qInsert},
		{&w.byEvent, qByEventID},
	} {
		st, err := l.txStmt(ctx, tx, p.query)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		*p.stmt = st
	}
	batch := make([]storage.Event, len(evs))
	copy(batch, evs)
	dup := make([]bool, len(evs))
	if err := w.insertRows(ctx, batch, dup); err != nil {
		return nil, err
	}
	res := make([]storage.AppendResult, len(evs))
	for i := range batch {
		res[i] = storage.AppendResult{Event: batch[i], Duplicate: dup[i]}
	}
	return res, nil
}

// txStmt returns query as a statement of tx: the cached one, reused on tx's
// connection, or else one prepared on it. Close it when done.
func (l *Store) txStmt(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	if st := l.stmts.load(query); st != nil {
		return tx.StmtContext(ctx, st), nil
	}
	return tx.PrepareContext(ctx, query)
}
