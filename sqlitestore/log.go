package sqlitestore

import (
	"database/sql"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/replayd/replayd/storage"
)

// Writes.
const (
	// qLastRow: the newest row, and the head (for guardHead).
	qLastRow          = `SELECT sequence, created_at, ordinal, (` + qHead + `) FROM events ORDER BY sequence DESC LIMIT 1`
	qLastTopicOrdinal = `SELECT topic_ordinal FROM events WHERE topic = ? ORDER BY sequence DESC LIMIT 1`
	qLastBroadcastOrd = `SELECT topic_ordinal FROM events WHERE topic IS NULL ORDER BY sequence DESC LIMIT 1`
	qInsert           = `INSERT INTO events (event_id, type, topic, payload, created_at, ordinal, topic_ordinal)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING`
	// qInsertRows begins a multi-row INSERT (see insertRun): without ON
	// CONFLICT, so a duplicate fails the statement, and the run goes again
	// row by row.
	qInsertRows = `INSERT INTO events (event_id, type, topic, payload, created_at, ordinal, topic_ordinal)
		VALUES (?, ?, ?, ?, ?, ?, ?)`
	qByEventID = `SELECT ` + eventColumns + ` FROM events WHERE event_id = ?`

	qPruneHead      = `SELECT sequence, topic, created_at FROM events ORDER BY sequence LIMIT ?`
	qPruneCountEdge = `SELECT coalesce((SELECT sequence FROM events ORDER BY sequence DESC LIMIT 1 OFFSET ?), 0)`
	qPruneDelete    = `DELETE FROM events WHERE sequence <= ?`
	qPruneMark      = `INSERT INTO events_prune_watermarks (topic, sequence) VALUES (?, ?)
		ON CONFLICT (topic) DO UPDATE SET sequence = max(sequence, excluded.sequence)`
)

// Store is the SQLite [storage.Store]: one table whose row sequence is the
// SSE id, and a tiny one of prune watermarks. It serialises this process's
// writes (appends, prune batches, schema, the Ready probe) on writeMu, so
// they queue here instead of in SQLite's sleeping busy handler; other
// processes' writes are waited for by the busy timeout.
type Store struct {
	db     *sql.DB
	file   *fileGuard   // the database file's identity (see fileid.go), checked before appends
	stmts  stmtCache    // the reads' prepared statements
	logger *slog.Logger // nil: discard
	wal    bool         // the database is in WAL mode: a read never waits for a writer

	// writeMu serialises the write transactions of this store and guards
	// writer and closed.
	writeMu sync.Mutex
	// streamQ queues UpdateStreams calls for group commit (streams.go).
	streamQ streamQueue
	writer  *logWriter // Append's connection
	closed  bool
	// writers counts the Appends and stream transactions waiting for
	// writeMu or holding it: a per-topic prune's transactions wait while
	// there are any (prunetopic.go), and are small and paced while the
	// log was appended to within quietAfter.
	writers  atomic.Int32
	appended atomic.Int64 // when an Append last began (Unix ns)
	// ckpt takes the checkpoints the writer's commits make due (see
	// checkpoint.go); nil until the writer's connection first turns its own
	// off, on a WAL database. Set under writeMu; stopped by Close.
	ckpt *checkpointer

	// issued is the highest sequence this store knows its log issued: its
	// appends' and every head it read. A head below it means the log was
	// replaced under the store (see guardHead).
	issued atomic.Int64
	// guarded is the transaction whose head guardTx checked last.
	guarded atomic.Pointer[sql.Tx]

	// testHookHandshake, if set, runs inside readHandshake's read
	// transaction, holding its pooled connection.
	testHookHandshake func()
	// testHookPruneChunk, if set, gets a per-topic prune's rows deleted
	// so far after each of its batches committed.
	testHookPruneChunk func(deleted int64)
}

var (
	_ storage.Store         = (*Store)(nil)
	_ storage.SchemaEnsurer = (*Store)(nil)
	_ storage.WriteProber   = (*Store)(nil)
	_ storage.PoolSizer     = (*Store)(nil)
	_ storage.TxAppender    = (*Store)(nil)
)

// topicArg is the SQL value of a topic: NULL for a broadcast.
func topicArg(topic string) any {
	if topic == "" {
		return nil
	}
	return topic
}
