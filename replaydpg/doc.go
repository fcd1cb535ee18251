// Package replaydpg is a PostgreSQL log for replayd: any number of
// processes, on any number of machines, open one database and serve the same
// log: a replayd.Store for several nodes. It uses pgx v5 and owns its connection pool.
//
// The promise everything rests on is that sequence order is visibility
// order: once a reader has seen sequence s, no row with a sequence ≤ s
// becomes visible later. An identity column does not give it (sequences are
// assigned at insert and become visible at commit, in any order), so Append
// assigns sequences itself under the row lock of a one-row head table, held
// from the assignment to the commit; every read is then a plain
// "sequence > cursor" index scan.
//
// Log identity (docs/restore.md): Open, on every node, in one
// transaction under the head row's lock, raises the head to the server's
// clock_timestamp() in Unix microseconds if it is below, recording the
// skipped range in prefix+"skips"; a cursor strictly inside a skipped range
// or above the head is foreign (Window's and Read's Foreign; an
// unknown_cursor gap), so a log restored with pg_dump/pg_restore, or from a
// physical backup, never hands a client another history under the same
// sequences. Open never sets the head below the highest sequence that
// exists or existed as far as the tables tell (rows, watermarks, skipped
// ranges): a head row lost (deleted, left out of a partial restore) or
// lowered is recreated or raised from them, with the global ordinal and
// created_at of the newest row, before the floor is raised. Open refuses,
// with an error saying what to do, when it had to recreate or raise the
// head row and the server's clock is not above the highest sequence found:
// sequences above it may have been issued, and nothing tells which.
// EnsureSchema makes the same repair, and raises the floor only after one.
// A log restored into the live tables under a running Store (emptied, then
// pg_restore --data-only) is caught by the append itself: under the head
// row's lock, a head below the highest sequence the Store knows was issued
// (its appends, the heads it read or was notified of) is raised to the
// clock, the skipped range recorded, before the rows take sequences (see
// floorGuard in append.go).
//
// Decisions beyond the Store contract:
//   - created_at is the server's clock_timestamp() taken under the head lock,
//     raised to the previous batch's if the clock stepped back; it has
//     microsecond precision.
//   - A duplicate event id takes no sequence, and a failed batch rolls the
//     head back with it, so sequences come out contiguous; nothing relies on
//     it (gap counts count visible rows).
//   - Payloads, types, event ids and topics that are not valid UTF-8 or hold
//     NUL are refused with replayd.ErrInvalid: PostgreSQL's text refuses them.
//   - The listener behind WaitForAppend is one extra session-level connection
//     (not from the pool; PgBouncer transaction pooling breaks LISTEN),
//     opened on the first call, named "replayd listener" in
//     pg_stat_activity. WithListenDSN points it elsewhere than the pool.
//   - The pool's sessions use plan_cache_mode=force_generic_plan unless the
//     DSN sets it: every query's plan is pinned by its text (see schema.go
//     and query.go), so planning once per connection is safe and saves
//     about half of a one-event Append.
//   - The pool's sessions use jit=off unless the DSN sets it: generic
//     plans of topic reads on a million rows passed jit_above_cost and spent
//     3-7 ms compiling each execution of a 0.2 ms read.
//   - Publish returns after the commit is durable: a session whose
//     synchronous_commit is off (the server's or the role's default) is set
//     to on, unless the DSN sets synchronous_commit, which is then the
//     application's own choice (off acknowledges events a server crash can
//     lose: TestCrashDurability fails with it).
//   - These are set when a connection opens, not as startup parameters,
//     which PgBouncer refuses ("unsupported startup parameter"); with
//     WithTransactionPooling none is set (a SET would stay on a server
//     connection other clients then use): set jit = off, and keep
//     synchronous_commit on, for the role or database there (ALTER ROLE …
//     SET jit = off).
//   - Read's MaxBytes counts payload bytes as the server stores them
//     (octet_length, so that the page is cut without fetching payloads):
//     the payload's own UTF-8 bytes in a UTF8 or SQL_ASCII database, its
//     bytes in the database's encoding otherwise.
//   - A batch holding an event id that is already stored costs a second
//     round trip: the first attempt takes every event for new and fails on
//     the unique constraint (logged by the server as an ERROR), and the
//     second looks each id up.
//
// Behind a connection pooler: in session pooling (PgBouncer pool_mode =
// session) Open needs nothing more. In transaction pooling the store's own
// statements work with WithTransactionPooling (one transaction per
// statement or pipeline, no session state, unnamed statements), but LISTEN
// is session state: give the listener a session-level connection with
// WithListenDSN (PostgreSQL directly, or a session-mode pool); Open refuses
// WithTransactionPooling without it.
//
// # Unknown outcomes
//
// An append is one pipeline that the server commits when it reaches its
// end. Once a byte of it may have been written, an error cannot say
// whether the server committed, or will: a connection that breaks (or a
// ctx that ends: pgx then closes the connection and sends a cancel
// request, which may land after the commit or never) leaves the server
// running the pipeline on its own, and if it was queued on the head row's
// lock it commits when it gets the lock, seconds later perhaps, and other
// nodes deliver the events. Append's error then wraps
// replayd.ErrOutcomeUnknown, which Publish passes on; publishing again
// with the same event ids (replayd.WithEventID) returns the stored events
// if the first attempt committed, and stores them once otherwise. Only
// two kinds of error prove that nothing was stored, and they do not wrap
// it: one from before the pipeline was written (no connection, ctx done,
// pgconn.SafeToRetry), and one the server reported with severity ERROR (a
// lock_timeout, a statement cancelled by the cancel request: the
// transaction aborts). A FATAL error does not prove it (a session
// terminated during its commit may have committed first).
// TestPublishOutcomeUnknown cuts the connection while the server holds the
// append queued on the lock: Publish returns ErrOutcomeUnknown, the server
// commits the event once the lock is free, and the retry returns it.
//
// # Publishing in the application's transaction
//
// PublishTx and PublishSQLTx put an event into prefix+"outbox" inside the
// application's transaction; a relay in every Store (Open starts it,
// Close stops it) moves the outbox into the log under the head row's
// lock, deleting the rows in the transaction that appends them, as soon
// as the publishing store sees the transaction committed, and within a
// second on any node otherwise (outbox.go, relay.go). The event is in the log if
// and only if the application's transaction commits, exactly once, and
// that transaction takes no lock a publisher or reader waits for.
//
// # Durable Streams
//
// Store is a storage.StreamStore (streams.go): a stream's record and its
// producers' states live in prefix+"streams" and prefix+"stream_producers"
// and commit with the stream's events in one transaction. UpdateStreams
// serialises per topic over every node with transaction-level advisory
// locks (one per topic, in key order, so no two transactions deadlock)
// and appends through Append's own statements under the head row's lock,
// so sequence order stays visibility order and the commit's NOTIFY wakes
// every node's tail as any append does. fn runs again after a
// serialisation failure or a deadlock the server reports (at most five
// times).
//
// # Readiness
//
// ProbeWrite, which EventHub.Ready calls, answers "could a publish get
// through now?": the server accepts writes, and the head row's lock, which
// every append takes first, can be had within what Ready's ctx leaves. It
// queues for the lock as an append does, and releases it at once without
// a WAL flush, so it holds up the publishes behind it for microseconds; a
// transaction holding the head row (a stuck session, a long manual
// UPDATE) makes Ready fail within its ctx, where a plain read would answer
// nil while every publish waits. The server's lock_timeout ends the wait,
// so a failed probe leaves nothing queued on the lock
// (TestReadyHeadLocked). It does not use NOWAIT: the lock is taken much
// of the time under a steady publish load (18-32% of NOWAIT probes found
// it taken in BenchmarkReadyDuringPublish with fsync off, 56-83% with it
// on) while every publish gets through within milliseconds.
package replaydpg
