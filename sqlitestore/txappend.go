package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

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

// qInsertTx is the writer's insertRows for one row, in one statement:
// the same columns and the same values, read in the same snapshot (the
// transaction's) as the insert. The newest row (l) gives the next ordinal
// and the floor of created_at; the newest row of the same topic (or of
// the broadcasts) the next topic ordinal; both are 1 in an empty log.
// While the newest row has no ordinal (an earlier version's rows not yet
// numbered by backfillOrdinals), the row is left unnumbered, as
// insertRows leaves it. AUTOINCREMENT gives the sequence: above the head,
// so above every range the sequence floor skipped. A known event id
// inserts nothing and returns no row: AppendTx then reads the original.
// One statement instead of insertRows' three: an application's
// transaction pays for each (BENCHMARKS.md).
const qInsertTx = `INSERT INTO events (event_id, type, topic, payload, created_at, ordinal, topic_ordinal)
	SELECT ?1, ?2, ?3, ?4, max(?5, coalesce(l.created_at, 0)),
		CASE WHEN l.sequence IS NULL THEN 1 WHEN l.ordinal IS NULL THEN NULL ELSE l.ordinal + 1 END,
		CASE WHEN l.sequence IS NOT NULL AND l.ordinal IS NULL THEN NULL
			ELSE 1 + coalesce(CASE WHEN ?3 IS NULL
				THEN (SELECT topic_ordinal FROM events WHERE topic IS NULL ORDER BY sequence DESC LIMIT 1)
				ELSE (SELECT topic_ordinal FROM events WHERE topic = ?3 ORDER BY sequence DESC LIMIT 1) END, 0) END
	FROM (SELECT 1) LEFT JOIN (SELECT sequence, created_at, ordinal FROM events ORDER BY sequence DESC LIMIT 1) AS l
	WHERE true
	ON CONFLICT (event_id) DO NOTHING
	RETURNING sequence, created_at`

// txQueries are the statements AppendTx and BeginTx run, and a stream
// transaction's (UpdateStreams; a job commit runs a put per job). Open
// prepares them on the *sql.DB, so that they are reused on the
// transaction's connection (Tx.StmtContext) without needing a second
// connection.
var txQueries = []string{qInsertTx, qByEventID, qTakeWriteLock, qHead,
	qStreamGet, qStreamsGet, qStreamPut, qStreamDelete, qProducersDelete, qProducerGet, qProducerPut, qStreamLast}

// prepareTx prepares txQueries (errors are left to AppendTx, which then
// prepares on the transaction).
func (s *Store) prepareTx(ctx context.Context) { s.stmts.prepare(ctx, s.db, txQueries) }

// BeginTx begins a transaction on the store's database and takes SQLite's
// write lock in it at once, waiting for another writer within the busy
// timeout (see OpenDB); if the log was replaced under the store, it raises
// the sequence floor in it (see guardHead). The application writes its own
// rows in it, appends events with AppendTx, and commits or rolls back.
// Until then every other write to the file waits, this store's appends
// included: keep it short, and never wait in it for a Publish of a hub
// over this store (that publish waits for the transaction).
func (s *Store) BeginTx(ctx context.Context) (*sql.Tx, error) {
	s.prepareTx(ctx) // between transactions: see stmtCache
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	lock, err := s.txStmt(ctx, tx, qTakeWriteLock)
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
	if err := s.guardTx(ctx, tx); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

// guardTx raises the sequence floor in tx if the log was replaced under
// the store (see guardHead), once per transaction: within one, the head
// cannot go back (a transaction that read a snapshot another connection
// then wrote over cannot write). The transaction last guarded is kept, so
// its address cannot be reused by another. AppendTx does not count its
// sequences as issued: tx may roll back.
func (s *Store) guardTx(ctx context.Context, tx *sql.Tx) error {
	if s.guarded.Load() == tx {
		return nil
	}
	head, err := s.txStmt(ctx, tx, qHead)
	if err == nil {
		var seq int64
		if err = head.QueryRowContext(ctx).Scan(&seq); err == nil {
			_, err = s.guardHead(ctx, tx, seq)
		}
		head.Close()
	}
	if err != nil {
		return fmt.Errorf("replayd: check the log's head: %w", err)
	}
	s.guarded.Store(tx)
	return nil
}

// AppendTx inserts evs into the log inside tx, a transaction on the
// store's *sql.DB, as Append does: each event gets the next sequence
// (above the head and every skipped range), the next ordinals, and a
// CreatedAt never below the newest row's; an event id already stored (as
// tx sees the log, its own rows included) stores nothing and returns the
// original with Duplicate set. The rows become visible, to every process,
// when tx commits, and vanish with a rollback.
//
// It does not take the store's write mutex: tx holds SQLite's write lock
// from its first write, which the store's own Append waits for. The
// writer's cached topic ordinals stay correct, since it checks the newest
// row before using them (see insertRows). An error leaves the rows of evs
// inserted before the failing one in tx: roll it back (a single event's
// failed insert leaves tx as it was). It never commits nor rolls back tx.
// Its first call in a transaction not begun by BeginTx reads the head
// first, and raises the floor if the log was replaced under the store.
func (s *Store) AppendTx(ctx context.Context, tx *sql.Tx, evs []storage.Event) ([]storage.AppendResult, error) {
	if tx == nil {
		return nil, fmt.Errorf("replayd: append in a transaction: nil *sql.Tx")
	}
	if err := s.checkFile(false); err != nil {
		return nil, err
	}
	if err := s.guardTx(ctx, tx); err != nil {
		return nil, err
	}
	insert, err := s.txStmt(ctx, tx, qInsertTx)
	if err != nil {
		return nil, err
	}
	defer insert.Close()
	res := make([]storage.AppendResult, len(evs))
	for i, ev := range evs {
		var created int64
		err := insert.QueryRowContext(ctx, ev.EventID, ev.Type, topicArg(ev.Topic), string(ev.Payload), time.Now().UnixMilli()).
			Scan(&ev.Sequence, &created)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			byEvent, err := s.txStmt(ctx, tx, qByEventID)
			if err != nil {
				return nil, err
			}
			orig, err := scanEvent(byEvent.QueryRowContext(ctx, ev.EventID))
			byEvent.Close()
			if err != nil {
				return nil, fmt.Errorf("read original of duplicate event id: %w", err)
			}
			res[i] = storage.AppendResult{Event: orig, Duplicate: true}
			continue
		case err != nil:
			return nil, err
		}
		ev.CreatedAt = time.UnixMilli(created)
		res[i] = storage.AppendResult{Event: ev}
	}
	return res, nil
}

// txStmt returns query as a statement of tx: the cached one, reused on tx's
// connection, or else one prepared on it. Close it when done.
func (s *Store) txStmt(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	if st := s.stmts.load(query); st != nil {
		return tx.StmtContext(ctx, st), nil
	}
	return tx.PrepareContext(ctx, query)
}
