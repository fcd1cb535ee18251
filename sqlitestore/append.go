package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/replayd/replayd/storage"
)

// logWriter is the connection the hub's writer goroutine appends on, with
// its statements prepared once. SQLite has no statement cache, and preparing
// them again for every commit cost about a third of a one-row publish. Only
// the store's Append uses it, under the store's writeMu.
type logWriter struct {
	conn                                     *sql.Conn
	begin, commit, rollback, insert, byEvent *sql.Stmt
	lastRow, lastTopicOrd, lastBroadcastOrd  *sql.Stmt

	// tords caches, by topic ("" = broadcasts), the topic ordinal of the
	// topic's newest row, valid while the log's newest row is still newest,
	// the one this writer wrote last: no other process has appended since.
	// Retention only deletes a prefix, which leaves the numbering of the
	// retained rows without holes whatever it deletes.
	tords  map[string]int64
	newest int64 // -1: tords is not valid

	// top is the newest row as this writer left it after its last commit,
	// and version the connection's data version then (see dataVersion).
	// While the data version is the same after the next BEGIN IMMEDIATE, no
	// other connection has written the file since, so the next batch need
	// not read the newest row (qLastRow): a statement fewer per commit.
	top     lastRow
	version uint32
	topSet  bool // insertRows set top for the batch being committed
	topOK   bool // top and version are valid
}

// lastRow is the log's newest row as insertRows needs it.
type lastRow struct {
	seq, createdAt int64
	ord            sql.NullInt64
	empty          bool // the log has no row
}

func openLogWriter(ctx context.Context, db *sql.DB) (*logWriter, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &logWriter{conn: conn, newest: -1}
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{
		{&w.begin, "BEGIN IMMEDIATE"},
		{&w.commit, "COMMIT"},
		{&w.rollback, "ROLLBACK"},
		{&w.lastRow, qLastRow},
		{&w.lastTopicOrd, qLastTopicOrdinal},
		{&w.lastBroadcastOrd, qLastBroadcastOrd},
		{&w.insert, qInsert},
		{&w.byEvent, qByEventID},
	} {
		if *p.stmt, err = conn.PrepareContext(ctx, p.query); err != nil {
			w.close(false)
			return nil, err
		}
	}
	return w, nil
}

// close releases the statements and gives the connection back to the pool,
// or makes the pool drop it if it may be stuck inside a transaction.
func (w *logWriter) close(broken bool) {
	for _, s := range []*sql.Stmt{w.begin, w.commit, w.rollback, w.lastRow, w.lastTopicOrd, w.lastBroadcastOrd, w.insert, w.byEvent} {
		if s != nil {
			s.Close()
		}
	}
	if broken {
		discard(w.conn)
	}
	w.conn.Close()
}

// appendBatch inserts evs in one transaction and fills in each one's
// sequence and creation time. A row whose event id already exists is not
// inserted: its entry is replaced by the stored original and dup is set.
// Every row of the batch gets the same created_at, taken inside the write
// and never below the newest stored row's.
//
// The caller holds l.writeMu.
func (l *Store) appendBatch(ctx context.Context, evs []storage.Event, dup []bool) error {
	if err := l.reserveWriter(ctx); err != nil {
		return err
	}
	broken, err := l.writer.append(ctx, evs, dup)
	// A pool of one connection (":memory:") cannot lend it to the writer
	// for good: give it back after every batch.
	if broken || l.db.Stats().MaxOpenConnections == 1 {
		l.releaseWriter(broken)
	}
	return err
}

// reserveWriter takes the writer's connection from the pool unless it
// holds it already. New calls it, so that a publish never queues for a
// connection behind readers; appendBatch calls it again after a broken
// connection was dropped, or on a pool of one, which the writer cannot keep.
// The caller holds l.writeMu.
func (l *Store) reserveWriter(ctx context.Context) error {
	if l.writer != nil {
		return nil
	}
	w, err := openLogWriter(ctx, l.db)
	if err != nil {
		return err
	}
	l.writer = w
	return nil
}

func (l *Store) releaseWriter(broken bool) {
	if l.writer != nil {
		l.writer.close(broken)
		l.writer = nil
	}
}

// append runs one batch; broken reports a connection left in an unknown
// state.
//
// Only BEGIN IMMEDIATE, which waits for other processes' write lock, runs
// with ctx. The statements after it run under the write lock, where nothing
// makes them wait, with a context that cannot end: a cancellable one costs
// the driver (and database/sql, for a query) a goroutine per statement,
// about a tenth of a one-row publish. ctx is still looked at before each
// statement, so an ended ctx rolls the batch back before its next row.
func (w *logWriter) append(ctx context.Context, evs []storage.Event, dup []bool) (broken bool, err error) {
	if err := retryBusy(ctx, func() error {
		_, err := w.begin.ExecContext(ctx)
		return err
	}); err != nil {
		return false, err
	}
	if err = w.insertRows(ctx, evs, dup); err == nil {
		// A fresh context: a cancelled one must not leave the transaction open.
		if _, err = w.commit.ExecContext(context.Background()); err == nil {
			v, ok := w.dataVersion()
			w.version, w.topOK = v, ok && w.topSet
			return false, nil
		}
	}
	w.newest, w.topOK = -1, false // the caches may hold rows rolled back
	_, rerr := w.rollback.ExecContext(context.Background())
	return rerr != nil, err
}

// dataVersion returns the connection's SQLITE_FCNTL_DATA_VERSION for the
// main database, which changes whenever the connection finds the file
// changed by another connection (it is read as a transaction starts), and
// false if the driver cannot tell (a driver other than modernc.org/sqlite).
// It runs no statement.
func (w *logWriter) dataVersion() (v uint32, ok bool) {
	err := w.conn.Raw(func(dc any) error {
		fc, is := dc.(interface {
			FileControlDataVersion(dbName string) (uint32, error)
		})
		if !is {
			return errNoDataVersion
		}
		var err error
		v, err = fc.FileControlDataVersion("main")
		return err
	})
	return v, err == nil
}

var errNoDataVersion = errors.New("no data version")

// readLastRow returns the log's newest row, from what the writer left after
// its last commit if no other connection has written the file since.
func (w *logWriter) readLastRow() (lastRow, error) {
	if w.topOK {
		if v, ok := w.dataVersion(); ok && v == w.version && w.top.seq == w.newest {
			return w.top, nil
		}
	}
	var r lastRow
	err := w.lastRow.QueryRowContext(context.Background()).Scan(&r.seq, &r.createdAt, &r.ord)
	if errors.Is(err, sql.ErrNoRows) {
		return lastRow{empty: true}, nil
	}
	return r, err
}

// insertRows numbers the rows it inserts (see span): ordinal follows the
// newest row's, topic_ordinal the newest row's of the same topic. While the
// newest row has no ordinal (an earlier version's rows not yet numbered by
// backfillOrdinals), it leaves its rows unnumbered too, so that unnumbered
// rows stay a suffix of the log.
func (w *logWriter) insertRows(ctx context.Context, evs []storage.Event, dup []bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	top, err := w.readLastRow()
	if err != nil {
		return err
	}
	w.topOK, w.topSet = false, false // until the commit
	newest, last, lastOrd, empty := top.seq, top.createdAt, top.ord, top.empty
	numbered := empty || lastOrd.Valid
	if !numbered || newest != w.newest || len(w.tords) > maxCachedTopics {
		clear(w.tords)
	}
	if w.tords == nil {
		w.tords = make(map[string]int64)
	}
	w.newest = newest
	tords := w.tords
	ord := lastOrd.Int64
	now := max(time.Now().UnixMilli(), last)
	// The statements run under the write lock (see append).
	sctx := context.Background()
	for i := range evs {
		if err := ctx.Err(); err != nil {
			return err
		}
		ev := &evs[i]
		var ordArg, tordArg any
		if numbered {
			tord, ok := tords[ev.Topic]
			if !ok {
				if tord, err = w.lastTopicOrdinal(sctx, ev.Topic); err != nil {
					return err
				}
			}
			ordArg, tordArg = ord+1, tord+1
		}
		res, err := w.insert.ExecContext(sctx, ev.EventID, ev.Type, topicArg(ev.Topic), string(ev.Payload), now, ordArg, tordArg)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			orig, err := scanEvent(w.byEvent.QueryRowContext(sctx, ev.EventID))
			if err != nil {
				return fmt.Errorf("read original of duplicate event id: %w", err)
			}
			*ev, dup[i] = orig, true
			continue
		}
		if ev.Sequence, err = res.LastInsertId(); err != nil {
			return err
		}
		if numbered {
			ord, tords[ev.Topic] = ordArg.(int64), tordArg.(int64)
			w.newest = ev.Sequence
			last = now
		}
		ev.CreatedAt = time.UnixMilli(now)
	}
	if numbered {
		// What the next batch finds as the newest row, if no other
		// connection writes in between (append keeps it once committed).
		w.top = lastRow{seq: w.newest, createdAt: last, ord: sql.NullInt64{Int64: ord, Valid: !empty || ord > 0}, empty: empty && ord == 0}
		w.topSet = true
	}
	return nil
}

// maxCachedTopics bounds logWriter.tords; past it the cache starts again.
const maxCachedTopics = 4096

// lastTopicOrdinal returns the topic ordinal of topic's newest row, 0 if
// it has none.
func (w *logWriter) lastTopicOrdinal(ctx context.Context, topic string) (int64, error) {
	var o sql.NullInt64
	var err error
	if topic == "" {
		err = w.lastBroadcastOrd.QueryRowContext(ctx).Scan(&o)
	} else {
		err = w.lastTopicOrd.QueryRowContext(ctx, topic).Scan(&o)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return o.Int64, err
}

// probeWrite takes the write lock on the writer's connection and releases
// it, writing nothing. The caller holds l.writeMu.
func (l *Store) probeWrite(ctx context.Context) error {
	if l.writer == nil {
		w, err := openLogWriter(ctx, l.db)
		if err != nil {
			return err
		}
		l.writer = w
	}
	_, err := l.writer.begin.ExecContext(ctx)
	broken := false
	if err == nil {
		_, rerr := l.writer.rollback.ExecContext(context.Background())
		broken = rerr != nil
	}
	if broken || l.db.Stats().MaxOpenConnections == 1 {
		l.releaseWriter(broken) // as appendBatch does
	}
	if err != nil {
		return fmt.Errorf("take the write lock: %w", err)
	}
	return nil
}
