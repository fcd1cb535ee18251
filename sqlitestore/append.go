package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/replayd/replayd/storage"
	"modernc.org/sqlite"
)

// logWriter is the connection the hub's writer goroutine appends on, with
// its statements prepared once. SQLite has no statement cache, and preparing
// them again for every commit cost about a third of a one-row publish. Only
// the store's Append uses it, under the store's writeMu.
type logWriter struct {
	store                                    *Store // its issued and logger, for guardHead
	conn                                     *sql.Conn
	begin, commit, rollback, insert, byEvent *sql.Stmt
	lastRow, lastTopicOrd, lastBroadcastOrd  *sql.Stmt
	head                                     *sql.Stmt

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

	// runs holds the multi-row INSERTs prepared so far, by row count.
	runs map[int]*sql.Stmt

	// pragmas: setPragmas changed the connection's busy_timeout (to 0,
	// see append) and temp_store (to MEMORY) from busyTimeout and
	// tempStore, the pool's values, which close sets back. A multi-row
	// INSERT keeps a statement journal, a copy of every page it changes
	// that an earlier statement of the transaction changed too, so it can
	// undo itself; past 64 KiB SQLite spills it to a temporary file. Rows
	// over 100 topics change a page each, and the spill's writes were as
	// many as the commit's.
	//
	// On a WAL database it also turns wal_autocheckpoint off (from
	// autoCheckpoint, the pool's value), and the store's checkpointer
	// takes the checkpoints this connection's commits make due (see
	// checkpoint.go).
	pragmas                bool
	busyTimeout, tempStore int64
	autoCheckpoint         int64 // 0: left as it was
}

// lastRow is the log's newest row as insertRows needs it.
type lastRow struct {
	seq, createdAt int64
	ord            sql.NullInt64
	empty          bool // the log has no row
}

func openLogWriter(ctx context.Context, s *Store) (*logWriter, error) {
	db := s.db
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &logWriter{store: s, conn: conn, newest: -1}
	// A pool of one (":memory:") lends the writer its connection for one
	// batch at a time, has no other connection to wait for, and no file.
	if db.Stats().MaxOpenConnections != 1 {
		if err := w.setPragmas(ctx); err != nil {
			w.close(true)
			return nil, err
		}
	}
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{
		{&w.begin, "BEGIN IMMEDIATE"},
		{&w.commit, "COMMIT"},
		{&w.rollback, "ROLLBACK"},
		{&w.lastRow, qLastRow},
		{&w.head, qHead},
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

// setPragmas sets the connection's pragmas for the writer, keeping the
// pool's values for close: busy_timeout off, so that a BEGIN IMMEDIATE that
// finds another connection's write lock returns SQLITE_BUSY at once and
// retryBusy waits instead, watching ctx (see append); temp_store MEMORY
// (see pragmas).
func (w *logWriter) setPragmas(ctx context.Context) error {
	var ms, temp int64
	if err := w.conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err != nil {
		return err
	}
	if err := w.conn.QueryRowContext(ctx, "PRAGMA temp_store").Scan(&temp); err != nil {
		return err
	}
	if _, err := w.conn.ExecContext(ctx, "PRAGMA busy_timeout = 0; PRAGMA temp_store = MEMORY"); err != nil {
		return err
	}
	w.pragmas, w.busyTimeout, w.tempStore = true, ms, temp
	if !w.store.wal {
		return nil
	}
	var pages int64
	if err := w.conn.QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&pages); err != nil {
		return err
	}
	if pages <= 0 || !w.countsPages() {
		// Checkpoints turned off for the pool (someone else takes them),
		// or a driver that cannot count the pages a commit wrote: SQLite
		// checkpoints in the commits, as on any other connection.
		return nil
	}
	if _, err := w.conn.ExecContext(ctx, "PRAGMA wal_autocheckpoint = 0"); err != nil {
		return err
	}
	w.autoCheckpoint = pages
	if w.store.ckpt == nil {
		w.store.ckpt = startCheckpointer(w.store.db, pages, w.store.logger)
	}
	return nil
}

// close releases the statements and gives the connection back to the pool,
// with its busy_timeout as it was, or makes the pool drop it if it may be
// stuck inside a transaction.
func (w *logWriter) close(broken bool) {
	for _, s := range []*sql.Stmt{w.begin, w.commit, w.rollback, w.lastRow, w.head, w.lastTopicOrd, w.lastBroadcastOrd, w.insert, w.byEvent} {
		if s != nil {
			s.Close()
		}
	}
	for _, s := range w.runs {
		s.Close()
	}
	if !broken && w.pragmas {
		_, err := w.conn.ExecContext(context.Background(),
			fmt.Sprintf("PRAGMA busy_timeout = %d; PRAGMA temp_store = %d", w.busyTimeout, w.tempStore))
		if err == nil && w.autoCheckpoint > 0 {
			_, err = w.conn.ExecContext(context.Background(),
				fmt.Sprintf("PRAGMA wal_autocheckpoint = %d", w.autoCheckpoint))
		}
		broken = err != nil
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
// The caller holds s.writeMu.
func (s *Store) appendBatch(ctx context.Context, evs []storage.Event, dup []bool) error {
	if err := s.reserveWriter(ctx); err != nil {
		return err
	}
	broken, err := s.writer.append(ctx, evs, dup)
	// A pool of one connection (":memory:") cannot lend it to the writer
	// for good: give it back after every batch.
	if broken || s.db.Stats().MaxOpenConnections == 1 {
		s.releaseWriter(broken)
	}
	return err
}

// reserveWriter takes the writer's connection from the pool unless it
// holds it already. New calls it, so that a publish never queues for a
// connection behind readers; appendBatch calls it again after a broken
// connection was dropped, or on a pool of one, which the writer cannot keep.
// The caller holds s.writeMu.
func (s *Store) reserveWriter(ctx context.Context) error {
	if s.writer != nil {
		return nil
	}
	w, err := openLogWriter(ctx, s)
	if err != nil {
		return err
	}
	s.writer = w
	return nil
}

func (s *Store) releaseWriter(broken bool) {
	if s.writer != nil {
		s.writer.close(broken)
		s.writer = nil
	}
}

// append runs one batch; broken reports a connection left in an unknown
// state.
//
// No statement runs with ctx: a cancellable context costs the driver (and
// database/sql, for a query) a goroutine per statement, and waking it a
// thread; for a one-row publish that was a tenth of the time, and more once
// the scheduler's other wake-ups were counted. The statements after BEGIN
// run under the write lock, where nothing makes them wait, and ctx is
// looked at before each, so an ended ctx rolls the batch back before its
// next row. BEGIN IMMEDIATE, which waits for another connection's write
// lock, finds busy_timeout off (see setPragmas) and gets SQLITE_BUSY at
// once: retryBusy waits, and gives up when ctx ends. On a pool of one,
// whose connection the writer borrows per batch with its pragmas as they
// are, BEGIN runs with ctx.
func (w *logWriter) append(ctx context.Context, evs []storage.Event, dup []bool) (broken bool, err error) {
	if err := w.beginWrite(ctx); err != nil {
		return false, err
	}
	if err = w.insertRows(ctx, evs, dup); err == nil {
		// A fresh context: a cancelled one must not leave the transaction open.
		if _, err = w.commit.ExecContext(context.Background()); err == nil {
			if w.autoCheckpoint > 0 {
				w.afterCommitCheckpoint()
			}
			v, ok := w.dataVersion()
			w.version, w.topOK = v, ok && w.topSet
			return false, nil
		}
	}
	w.newest, w.topOK = -1, false // the caches may hold rows rolled back
	_, rerr := w.rollback.ExecContext(context.Background())
	return rerr != nil, err
}

// beginWrite runs BEGIN IMMEDIATE until it has the write lock, or ctx ends
// (see append).
func (w *logWriter) beginWrite(ctx context.Context) error {
	bctx := ctx
	if w.pragmas {
		bctx = context.Background()
	}
	return retryBusy(ctx, func() error {
		_, err := w.begin.ExecContext(bctx)
		return err
	})
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

// afterCommitCheckpoint reports the pages the commit wrote to the
// checkpointer, or, when the checkpointer cannot keep the WAL bounded,
// checkpoints it here (see checkpointer): a PASSIVE checkpoint, which
// never waits, and, under writeMu, overlaps no commit of this process.
func (w *logWriter) afterCommitCheckpoint() {
	c := w.store.ckpt
	c.wrote(w.walPages())
	if c.takeOver() {
		// Failing only delays it: the checkpointer's next one, or
		// SQLite's own as the pool's connections close.
		w.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)")
	}
}

// countsPages reports whether walPages can tell.
func (w *logWriter) countsPages() (ok bool) {
	w.conn.Raw(func(dc any) error {
		_, ok = dc.(pageCounter)
		return nil
	})
	return ok
}

// pageCounter is modernc.org/sqlite's connection, as walPages needs it.
type pageCounter interface {
	Status(op sqlite.DBStatusOp, reset bool) (current, high int, err error)
}

// walPages returns the pages the connection wrote to the WAL since it was
// last asked (SQLITE_DBSTATUS_CACHE_WRITE, reset as it is read): its last
// commit's, in the writer. It runs no statement; 0 if the driver cannot
// tell (see countsPages).
func (w *logWriter) walPages() (pages int) {
	w.conn.Raw(func(dc any) error {
		if st, is := dc.(pageCounter); is {
			pages, _, _ = st.Status(sqlite.DBStatusCacheWrite, true)
		}
		return nil
	})
	return pages
}

// readLastRow returns the log's newest row, from what the writer left after
// its last commit if no other connection has written the file since. When
// one may have, it also reads the head, and raises the floor if the log
// was replaced under the store (guardHead): the rows of this transaction
// then go above the raised head.
func (w *logWriter) readLastRow() (lastRow, error) {
	if w.topOK {
		if v, ok := w.dataVersion(); ok && v == w.version && w.top.seq == w.newest {
			return w.top, nil
		}
	}
	sctx := context.Background() // under the write lock (see append)
	var r lastRow
	var head int64
	err := w.lastRow.QueryRowContext(sctx).Scan(&r.seq, &r.createdAt, &r.ord, &head)
	if errors.Is(err, sql.ErrNoRows) { // no row: the head alone
		r, err = lastRow{empty: true}, w.head.QueryRowContext(sctx).Scan(&head)
	}
	if err != nil {
		return lastRow{}, err
	}
	_, err = w.store.guardHead(sctx, w.conn, head)
	return r, err
}

// insertRows numbers the rows it inserts (see span): ordinal follows the
// newest row's, topic_ordinal the newest row's of the same topic. While the
// newest row has no ordinal (an earlier version's rows not yet numbered by
// backfillOrdinals), it leaves its rows unnumbered too, so that unnumbered
// rows stay a suffix of the log.
//
// Runs of rows go in multi-row INSERTs (see insertRun); a run that fails on
// a duplicate event id, or on a row SQLite refuses, goes again row by row,
// where a duplicate is found and a refused row named.
func (w *logWriter) insertRows(ctx context.Context, evs []storage.Event, dup []bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	top, err := w.readLastRow()
	if err != nil {
		return err
	}
	w.topOK, w.topSet = false, false // until the commit
	numbered := top.empty || top.ord.Valid
	if !numbered || top.seq != w.newest || len(w.tords) > maxCachedTopics {
		clear(w.tords)
	}
	if w.tords == nil {
		w.tords = make(map[string]int64)
	}
	b := rowBatch{w: w, numbered: numbered, ord: top.ord.Int64, last: top.createdAt,
		now: max(time.Now().UnixMilli(), top.createdAt)}
	w.newest = top.seq
	for i := 0; i < len(evs); {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := runRows(len(evs) - i)
		if n > 1 {
			ok, err := b.insertRun(evs[i : i+n])
			if err != nil {
				return err
			}
			if ok {
				i += n
				continue
			}
		}
		for end := i + n; i < end; i++ {
			if err := b.insertOne(&evs[i], &dup[i]); err != nil {
				return err
			}
		}
	}
	if numbered {
		// What the next batch finds as the newest row, if no other
		// connection writes in between (append keeps it once committed).
		w.top = lastRow{seq: w.newest, createdAt: b.last, ord: sql.NullInt64{Int64: b.ord, Valid: !top.empty || b.ord > 0}, empty: top.empty && b.ord == 0}
		w.topSet = true
	}
	return nil
}

// runSizes are the row counts of the multi-row INSERTs, largest first.
// Inserting 16 rows in one statement took half the time per row of 16
// statements; 64 gained little more.
var runSizes = [...]int{16, 4}

// runRows returns how many of left rows the next statement inserts.
func runRows(left int) int {
	for _, n := range runSizes {
		if left >= n {
			return n
		}
	}
	return 1
}

// rowBatch is one batch's insertion state: the numbering so far, and the
// created_at every row gets.
type rowBatch struct {
	w        *logWriter
	numbered bool
	ord      int64 // the ordinal of the newest row inserted
	last     int64 // created_at of the newest row
	now      int64 // the batch's created_at
	args     []any // insertRun's arguments, kept between runs
	undo     []topicOrdinal
}

// topicOrdinal is a topic's newest topic ordinal, as tords had it before a
// run.
type topicOrdinal struct {
	topic string
	ord   int64
}

// number returns the ordinals of the next row of topic (nil, nil while the
// log is unnumbered) and counts it in tords. For a run, it records what
// tords had, so that undo can set it back.
func (b *rowBatch) number(topic string, run bool) (ordArg, tordArg any, err error) {
	if !b.numbered {
		return nil, nil, nil
	}
	tords := b.w.tords
	tord, ok := tords[topic]
	if !ok {
		if tord, err = b.w.lastTopicOrdinal(context.Background(), topic); err != nil {
			return nil, nil, err
		}
	}
	if run && !slices.ContainsFunc(b.undo, func(u topicOrdinal) bool { return u.topic == topic }) {
		b.undo = append(b.undo, topicOrdinal{topic, tord})
	}
	tords[topic] = tord + 1
	return b.ord + 1, tord + 1, nil
}

// insertRun inserts evs in one statement. It reports false, having inserted
// nothing, when SQLite refused the statement for a row's sake: one is a
// duplicate, say. SQLite assigns the rows of one INSERT consecutive
// sequences, the last being the statement's last insert id.
func (b *rowBatch) insertRun(evs []storage.Event) (ok bool, err error) {
	w, ord := b.w, b.ord
	b.args, b.undo = b.args[:0], b.undo[:0]
	for i := range evs {
		ev := &evs[i]
		ordArg, tordArg, err := b.number(ev.Topic, true)
		if err != nil {
			return false, err
		}
		if b.numbered {
			b.ord++
		}
		b.args = append(b.args, ev.EventID, ev.Type, topicArg(ev.Topic), string(ev.Payload), b.now, ordArg, tordArg)
	}
	stmt, err := w.runStmt(len(evs))
	if err != nil {
		return false, err
	}
	res, err := stmt.ExecContext(context.Background(), b.args...)
	clear(b.args) // let the payloads go
	if err != nil {
		if !rowError(err) {
			return false, err
		}
		// The statement was undone; the run goes again row by row.
		b.ord = ord
		for _, u := range b.undo {
			w.tords[u.topic] = u.ord
		}
		return false, nil
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, err
	} else if n != int64(len(evs)) {
		// A trigger's RAISE(IGNORE) dropped a row: which one, and so the
		// sequences of the others, cannot be told. The batch is rolled back.
		return false, fmt.Errorf("a multi-row insert of %d rows inserted %d", len(evs), n)
	}
	lastSeq, err := res.LastInsertId()
	if err != nil {
		return false, err
	}
	created := time.UnixMilli(b.now)
	for i := range evs {
		evs[i].Sequence, evs[i].CreatedAt = lastSeq-int64(len(evs)-1-i), created
	}
	if b.numbered {
		w.newest, b.last = lastSeq, b.now
	}
	return true, nil
}

// insertOne inserts ev, or finds it a duplicate and replaces it with the
// stored original.
func (b *rowBatch) insertOne(ev *storage.Event, dup *bool) error {
	w := b.w
	ordArg, tordArg, err := b.number(ev.Topic, false)
	if err != nil {
		return err
	}
	sctx := context.Background() // under the write lock (see append)
	res, err := w.insert.ExecContext(sctx, ev.EventID, ev.Type, topicArg(ev.Topic), string(ev.Payload), b.now, ordArg, tordArg)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		if b.numbered { // not inserted: the topic's ordinal was not used
			w.tords[ev.Topic]--
		}
		orig, err := scanEvent(w.byEvent.QueryRowContext(sctx, ev.EventID))
		if err != nil {
			return fmt.Errorf("read original of duplicate event id: %w", err)
		}
		*ev, *dup = orig, true
		return nil
	}
	if ev.Sequence, err = res.LastInsertId(); err != nil {
		return err
	}
	if b.numbered {
		b.ord++
		w.newest, b.last = ev.Sequence, b.now
	}
	ev.CreatedAt = time.UnixMilli(b.now)
	return nil
}

// runStmt returns the prepared INSERT of n rows (one of runSizes).
func (w *logWriter) runStmt(n int) (*sql.Stmt, error) {
	if st := w.runs[n]; st != nil {
		return st, nil
	}
	q := qInsertRows + strings.Repeat(", (?, ?, ?, ?, ?, ?, ?)", n-1)
	st, err := w.conn.PrepareContext(context.Background(), q)
	if err != nil {
		return nil, err
	}
	if w.runs == nil {
		w.runs = make(map[int]*sql.Stmt)
	}
	w.runs[n] = st
	return st, nil
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
// it, writing nothing. The caller holds s.writeMu.
func (s *Store) probeWrite(ctx context.Context) error {
	if s.writer == nil {
		w, err := openLogWriter(ctx, s)
		if err != nil {
			return err
		}
		s.writer = w
	}
	err := s.writer.beginWrite(ctx)
	broken := false
	if err == nil {
		_, rerr := s.writer.rollback.ExecContext(context.Background())
		broken = rerr != nil
	}
	if broken || s.db.Stats().MaxOpenConnections == 1 {
		s.releaseWriter(broken) // as appendBatch does
	}
	if err != nil {
		return fmt.Errorf("take the write lock: %w", err)
	}
	return nil
}
