package replaydpg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The schema, for a table prefix p (written %[1]s). The tables:
//
//   - p+"events": the log. sequence is assigned by Append under the head
//     row's lock, never by an identity column (see Store). topic is NULL
//     for a broadcast. topic_ord numbers the rows of one topic (broadcasts
//     are their own group) and global_ord numbers every row; both are
//     assigned under the same lock and, since only a prefix of each topic
//     is ever deleted, topic_ord is contiguous over a group's retained
//     rows, so the number of a group's rows in a range is a difference of
//     two ordinals found by index. global_ord is too as long as only
//     prefixes of the log are deleted; below the hole mark (prune.go,
//     holeKey: topics pruned apart) it is not, and is not trusted there.
//   - p+"head": one row holding the highest sequence ever assigned, the
//     number of rows ever inserted, and the newest created_at. Its row lock
//     serialises appends; it never goes backwards, whatever is deleted.
//   - p+"watermarks": per topic (the empty string for broadcasts), the
//     highest sequence retention deleted.
//   - p+"skips": the sequence floor's skipped ranges (see Open): the
//     sequences strictly between after and through were never issued.
//   - p+"outbox": events published inside an application's transaction,
//     until the relay moves them into p+"events" (outbox.go, relay.go).
//   - p+"streams", p+"stream_producers": Durable Streams' state
//     (storage.StreamStore, streams.go), bytes the hub encodes.
//
// One index on (topic, sequence) serves every group, broadcasts (NULL)
// included: a scope's reads are one index range scan per group, merged by
// sequence with a bounded sort. The group reads order by (topic, sequence)
// and bound the topic with row comparisons, not "topic = x": with an
// equality the planner sees the topic as a constant, finds the primary key
// gives the same order, and when it misjudges the topic's frequency walks
// the primary key backwards filtering every row (measured: 5,500 rows read
// for 11 returned). No other index gives (topic, sequence) order, so the
// plan cannot depend on statistics; TestQueryPlans pins it.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS %[1]sevents (
		sequence   bigint      NOT NULL,
		event_id   text        NOT NULL,
		type       text        NOT NULL,
		topic      text,
		payload    text        NOT NULL,
		created_at timestamptz NOT NULL,
		topic_ord  bigint      NOT NULL,
		global_ord bigint      NOT NULL,
		CONSTRAINT %[1]sevents_pkey PRIMARY KEY (sequence) INCLUDE (global_ord),
		CONSTRAINT %[1]sevents_event_id_key UNIQUE (event_id)
	)`,
	`CREATE INDEX IF NOT EXISTS %[1]sevents_topic_seq ON %[1]sevents (topic, sequence) INCLUDE (topic_ord)`,
	`CREATE TABLE IF NOT EXISTS %[1]shead (
		id         int         PRIMARY KEY CHECK (id = 1),
		seq        bigint      NOT NULL,
		ord        bigint      NOT NULL,
		created_at timestamptz NOT NULL
	)`,
	`CREATE TABLE IF NOT EXISTS %[1]swatermarks (
		topic    text   PRIMARY KEY, -- '' for broadcasts
		sequence bigint NOT NULL
	)`,
	`CREATE TABLE IF NOT EXISTS %[1]sskips (
		after   bigint PRIMARY KEY, -- the head when the log was opened
		through bigint NOT NULL     -- the head it was raised to
	)`,
	// Events published inside applications' transactions, waiting for the
	// relay (relay.go). No index but the key: the application's insert
	// must cost no more than its own row's.
	`CREATE TABLE IF NOT EXISTS %[1]soutbox (
		id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, -- the relay's order
		event_id text   NOT NULL,
		type     text   NOT NULL,
		topic    text,
		payload  text   NOT NULL
	)`,
	// Durable Streams' state (streams.go): a record per stream, opaque to
	// the store, and the state of each idempotent producer of a stream.
	`CREATE TABLE IF NOT EXISTS %[1]sstreams (
		topic      text   PRIMARY KEY,
		meta       bytea  NOT NULL,
		expires_at bigint NOT NULL -- Unix milliseconds; 0: never
	)`,
	`CREATE TABLE IF NOT EXISTS %[1]sstream_producers (
		topic    text  NOT NULL,
		producer text  NOT NULL,
		state    bytea NOT NULL,
		PRIMARY KEY (topic, producer)
	)`,
	// The records the Durable Streams sweep must look at (DueStreams).
	`CREATE INDEX IF NOT EXISTS %[1]sstreams_due ON %[1]sstreams (expires_at, topic) WHERE expires_at > 0`,
}

// qSchemaColumns checks that an events table found under the prefix is ours.
const qSchemaColumns = `SELECT count(*) FROM pg_attribute
	WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
	AND attname IN ('sequence', 'event_id', 'type', 'topic', 'payload', 'created_at', 'topic_ord', 'global_ord')`

// EnsureSchema creates the tables if they are missing (Open does it too).
func (s *Store) EnsureSchema(ctx context.Context) error {
	if s.isClosed() {
		return ErrClosed
	}
	return s.ensureSchema(ctx, false)
}

// ensureSchema creates the tables in one transaction, under an advisory
// lock so that nodes starting together do not race on CREATE ... IF NOT
// EXISTS (which is not atomic against itself), then, in a second one,
// makes sure of the head row (see raiseHead), raising the sequence floor
// if floor is set. Two transactions, because the first locks the events
// table (CREATE INDEX IF NOT EXISTS) and an append takes the head row's
// lock before the table's: taking the head row's after the table's would
// deadlock with it.
func (s *Store) ensureSchema(ctx context.Context, floor bool) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.schemaLock(ctx, tx); err != nil {
			return err
		}
		for i, stmt := range schema {
			if _, err := tx.Exec(ctx, render(stmt, s.prefix)); err != nil {
				return err
			}
			if i > 0 {
				continue
			}
			// CREATE TABLE IF NOT EXISTS keeps a table of the same name that
			// an application made for itself: refuse it rather than fail later.
			var n int
			if err := tx.QueryRow(ctx, qSchemaColumns, s.prefix+"events").Scan(&n); err != nil {
				return err
			}
			if n != 8 {
				return fmt.Errorf("table %sevents exists but is not replayd's", s.prefix)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The advisory lock first: with the head row missing, another node's
		// Open would recreate it too.
		if err := s.schemaLock(ctx, tx); err != nil {
			return err
		}
		return s.raiseHead(ctx, tx, floor)
	})
}

// schemaLock takes the advisory lock of the log's schema, held until tx
// ends.
func (s *Store) schemaLock(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "replayd schema "+s.prefix)
	return err
}
