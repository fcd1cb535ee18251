// Package replaydredis is a Redis log for replayd: any number of
// processes, on any number of machines, open one Redis and serve the same
// log, a replayd.Store for several nodes as the PostgreSQL store
// (replaydpg) is. It runs against Redis 7 or later, a single primary (not
// Redis Cluster, though every key of a log shares one hash slot).
//
// # The client
//
// It uses go-redis v9 (github.com/redis/go-redis/v9), Redis's own
// maintained Go client, rather than rueidis: every operation of the store
// is one Lua script (below), so rueidis's strengths (auto-pipelining of
// many small commands, client-side caching) buy nothing here, while
// go-redis gives, with its plain connection pool, what the store needs:
// an OnConnect hook that runs on every new connection before any command
// (the log identity check below is built on it), scripts run by EVALSHA
// with the EVAL fallback after a restart emptied the script cache, and a
// pool whose Close closes in-use connections (which ends the listener's
// blocking XREAD at once).
//
// # Keys
//
// A log is the keys under one prefix P (WithPrefix; "replayd" by
// default), written {P}: so that they share one hash slot:
//
//	{P}:head   string  the head: the highest sequence ever assigned or skipped
//	{P}:at     string  the newest created_at, Unix microseconds (never decreases)
//	{P}:log    stream  every retained event, entry id "<sequence>-0",
//	                   fields i (event id), y (type), t (topic), p (payload),
//	                   c (created_at, Unix microseconds)
//	{P}:all    zset    every retained sequence (member and score: the sequence)
//	{P}:t:<T>  zset    the retained sequences of topic T
//	{P}:b      zset    the retained sequences of broadcasts
//	{P}:ids    hash    event id -> sequence, of every retained event
//	{P}:marks  hash    prune watermarks: "t:<T>" per topic, "b" for
//	                   broadcasts, "*" the highest of all
//	{P}:skips  zset    the sequence floor's skipped ranges: member the
//	                   range's start (exclusive), score its end (exclusive)
//	{P}:run    string  the log identity: the run_id of the Redis process
//	                   that last checked the log (see Log identity)
//	{P}:topics set     the topics with retained events (per-topic retention)
//	{P}:s:<T>  hash    Durable Streams: the record of stream T (m: metadata, x: expiry)
//	{P}:p:<T>  hash    Durable Streams: producer id -> state, of stream T
//	{P}:sv:<T> string  Durable Streams: T's version, raised by each commit naming it
//	{P}:due    zset    Durable Streams: the records with an expiry (score), for DueStreams
//
// The stream holds each payload once; the sorted sets are the indexes
// (a stream cannot count the entries of a range, a sorted set counts them
// in O(log n) with ZCOUNT). Scores are doubles, exact for integers below
// 2^53: a sequence in Unix microseconds (the sequence floor) stays below
// it until the year 2255.
//
// # One script per operation
//
// Append, Read, Window, Count, a prune batch, Open's floor and the
// identity check are each one Lua script, and Redis runs a script alone:
// nothing else runs between its first command and its last. So a script
// is an atomic write and a consistent snapshot at once, which gives the
// storage contract's hardest promise for free: sequence order is
// visibility order (an append's sequences, assigned by raising the head
// inside the script, become visible with it, before any later append's).
// The scripts check everything before their first write (Redis does not
// roll a failed script back).
//
// Append reads the head, gives each new event the next sequence, and for
// each one XADDs it to the stream with the explicit id "<sequence>-0",
// ZADDs the sequence to {P}:all and to its topic's set, and HSETs its
// event id; then it sets the head and {P}:at. An event id found in
// {P}:ids (or earlier in the batch) is a duplicate: the stored original is
// returned and nothing is written for it; a duplicate takes no sequence.
// created_at is Redis's TIME, raised to {P}:at if the server's clock
// stepped back.
//
// Idempotency by event id lasts as long as the event is retained: Prune
// deletes the event's id with it, as the SQLite and PostgreSQL stores
// delete the row holding the unique id.
//
// # Reading a scope of several topics
//
// A scope's events are the union of its topics' sets and the broadcasts'
// ({P}:all for the global scope). Read takes, from each set, the first
// Limit+1 sequences above the cursor (ZRANGEBYSCORE ... LIMIT), merges
// them in order, and loads the first Limit (fewer once MaxBytes is
// reached) from the stream by id (XRANGE s-0 s-0): the union's oldest
// Limit+1 are among them, so More is exact. Window counts the scope's
// events above the cursor with ZCOUNT on each set, and finds where the
// window starts from each set's newest Limit+1 (ZREVRANGEBYSCORE): its
// cost grows with the number of topics and the limit, not with the
// events above the cursor. The watermark of a scope is the highest of its
// topics' fields and "b" in {P}:marks ("*" for the global scope).
//
// # Prune
//
// A prune batch (a script) deletes at most 1000 events, none above the
// head Prune read first, each removed from the stream, its sets and
// {P}:ids with its topic's watermark and the global one raised in the
// same script; Prune runs batches until one deletes fewer. A policy
// without Topics deletes the log's oldest events: as many as MaxEvents
// condemns (ZCARD of {P}:all), and beyond that those older than MaxAge,
// reading the stream from its start 16 entries at a time (payloads may
// be large). With Topics, each topic of {P}:topics that an entry governs
// loses the prefix of its own set the entry condemns, and the broadcasts
// and the other topics the default's: MaxEvents counted over their union
// (merged a sequence at a time, one probe per topic), MaxAge per topic.
// PruneTopic (storage.TopicPruner) deletes a topic's prefix through a
// sequence the same way.
//
// # Waking StartTail
//
// Store is a storage.Notifier: a listener goroutine (started by the first
// WaitForAppend) holds one connection of its own, blocked in XREAD BLOCK
// on the stream from the head it knows; an append by any node wakes it,
// it reads the head and wakes every WaitForAppend. No pub/sub: a stream
// read from a known id cannot miss an entry appended between two reads,
// as a notification sent while nobody listened would be lost. A floor
// raised without an event does not wake it; the hub's fallback poll
// covers that. Idle cost: one XREAD returning empty every 5 seconds.
//
// # Log identity
//
// Open raises the head to Redis's clock in Unix microseconds if it is
// below, recording the range skipped in {P}:skips (the sequence floor of
// storage.Store), as the other stores do: a cursor strictly inside a
// skipped range, or above the head, is foreign.
//
// Redis can lose acknowledged writes: with appendfsync everysec a kill -9
// loses up to a second of them; a restart from an older RDB snapshot, or
// a failover to a replica that lagged, loses everything after it. Each of
// those is a restart of the Redis process that holds the log, or another
// process taking it over, and every one of them changes Redis's run_id
// (INFO server). So every new connection of a Store, before it runs any
// command (go-redis's OnConnect), reads the server's run_id and runs the
// identity check: if {P}:run is not that run_id, the log is in a process
// this log never checked, and may have lost writes: the check raises the
// sequence floor to the clock, as an open does, and stores the run_id.
// Since a restarted or promoted server has no connection that predates
// it, every command any node sends it comes after a check: the lost
// history's sequences fall in the skipped range, so no sequence is issued
// twice, and a client holding one of them gets unknown_cursor, never a
// silent hole. The floor needs the clock to be above every sequence the
// log issued (fewer than 1,000,000 events a second on average since the
// last open).
//
// A log emptied or replaced under a running Store without a restart
// (FLUSHALL, keys deleted or restored from outside) is caught as the
// other stores catch it: each Store remembers the highest sequence it
// knows its log issued (its appends, the heads it read), and the append
// script, finding the head missing or below it, raises the floor before
// its events take sequences.
//
// # Durability
//
// An Append returns once Redis has run its script: what survives a crash
// then is Redis's persistence setting, not the store's.
//
//	appendonly yes, appendfsync always   every acknowledged append survives a
//	                                     kill -9 or power loss; each write waits
//	                                     for an fsync
//	appendonly yes, appendfsync everysec up to a second of acknowledged appends
//	                                     lost by a crash (detected, see above)
//	appendonly no (RDB snapshots)        everything since the last snapshot
//	                                     lost by a crash (detected)
//	replica failover                     what the replica had not received
//	                                     (detected: another run_id)
//
// # Errors and unknown outcomes
//
// An append whose script may have run (a broken connection or an ended
// ctx after it was sent) returns an error wrapping
// replayd.ErrOutcomeUnknown; an error Redis replied with, or a failure to
// dial, stored nothing. The client's retries are off, so that a retried
// script never reports the events of its first run as duplicates.
//
// # Durable Streams
//
// Store is a storage.StreamStore (streams.go): UpdateStreams is an
// optimistic transaction. fn reads through plain commands and its writes
// are kept in memory; the commit is one script that checks that the
// versions of the transaction's topics, and, once it appended or read a
// topic's newest event, the head, are what the transaction started from,
// and then writes everything, or nothing, and fn runs again after a short
// random back-off (at most 64 times). The sequences, created_at and
// duplicates of its events are decided when fn appends them, from the
// head read at its start: with the head unchanged at the commit they are
// exact. A stream transaction that appends retries while other appends
// land during it. DueStreams reads {P}:due, kept by the commits.
//
// Not done: publishing in the application's transaction (Redis has no
// transaction an application holds open), and an index of expiry times.
package replaydredis
