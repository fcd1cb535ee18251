// Package replayd serves resumable Server-Sent Events from an append-only
// SQLite log.
//
// Every published event is a row in one table; the row's sequence is the SSE
// id. When a browser's EventSource reconnects it sends the last id it saw as
// Last-Event-ID, and replayd treats that as a cursor into the durable log:
// the client gets what it missed, in order, then the live stream. When it
// cannot get everything, it is told so by a gap frame, never by silence.
// There is no broker: the log is the only shared state, so a server restart,
// a redeploy or a second process loses nothing a client could resume from.
// You bring the HTTP server and the payloads; replayd owns the log, the
// replay, the per-topic fan-out, retention and cross-process tailing.
//
// # The model
//
// A hub ([New]) wraps a *sql.DB, usually from [OpenDB], and creates the schema
// if it is missing: a table events and a table events_prune_watermarks.
// [EventHub.Publish] commits one row and returns the [Event] with its
// sequence. Sequences increase but need not be contiguous (a rejected
// duplicate event id may use one up). The head ([EventHub.LatestSequence]) is
// the highest sequence ever assigned; it never goes backwards, even when
// retention has deleted every row.
//
// Topics scope delivery. An event published on "room-42" reaches connections
// on room-42 and global connections; an event published on "" is a broadcast
// and reaches every connection. A connection without a topic is global and
// sees every event. The same rule decides live delivery, replay and gaps.
//
// [EventHub.Handler] is the SSE endpoint. The topic is the "topic" query
// parameter (trimmed); the cursor is the Last-Event-ID header, or failing that
// the lastEventId query parameter, so a page can start a stream from the
// sequence it rendered. Each stream begins with a hello frame whose id is the
// stream's cursor (the client's, or the head for a fresh client), so even a
// client that drops before any event arrives resumes from where it joined.
// Then, if owed, one gap frame (no id), then the replayed events, then live
// events and heartbeats (no id). A gap's "reason" is one of
//
//   - "replay_limit": more events were missed than SSEOptions.ReplayLimit;
//     the newest ReplayLimit are replayed and the gap names the older ones
//     exactly (missedFrom, missedThrough, missed);
//   - "pruned": retention deleted events above the cursor; missed is null,
//     because a deleted row cannot be counted;
//   - "unknown_cursor": the cursor is above the head (the log was reset or
//     replaced); the stream continues from the head;
//   - "invalid_cursor": the cursor is not a decimal integer in [0, 2^63-1];
//     the stream continues from the head.
//
// Every gap frame carries all six keys, and a client should treat any gap as
// "re-sync from a snapshot".
//
// # Live delivery, tail and slow consumers
//
// Each hub has one live position: the highest sequence it has delivered
// live. It starts at the head when the hub is created, so rows that existed
// before are reached by replay, never live. Every row above it reaches each
// live subscriber of the hub exactly once and in sequence order, whether this
// hub published it or another process did. Concurrent Publish calls are
// committed together in one transaction (group commit) and delivered in
// sequence order; the writer waits up to 200µs for as many publishes as
// its previous batch held, so a busy log commits in large batches while a
// lone publisher never waits. A row that is not the next one expected (another process
// wrote in between) first pulls the missing rows from the log. Without
// [EventHub.StartTail] a hub learns of other processes' rows only at its next
// publish; with it, it polls the head (default every 200ms) and reads rows
// only when the head moved. If rows above the live position were pruned
// before they could be delivered, or cannot be read, the hub ends every open
// stream so that its clients reconnect and get a gap.
//
// A publish never waits on an SSE client. Each connection has a queue of
// unsent frames bounded by SSEOptions.MaxBufferedBytes (default 1 MiB) and
// each write must finish within 7.5-15s; a client past either limit is
// disconnected, which is safe because it resumes from the log.
//
// # Retention
//
// [EventHub.Prune] deletes the oldest rows by [RetentionPolicy] (all but the
// newest MaxEvents of the whole log, and those older than MaxAge) in batches
// of at most 1,000 rows, and records in the same transaction, per topic and
// for broadcasts, the highest sequence deleted: the prune watermark. A client
// that resumes below the watermark of its scope gets a "pruned" gap instead
// of a partial history that looks complete. [EventHub.StartRetention] prunes
// once at start and then every interval (default 1h).
//
// # Decisions where the specification is silent
//
//   - New creates the schema; [EventHub.EnsureSchema] remains for explicit use
//     (for example by a migration step) and is idempotent.
//   - Each row carries its ordinal in the log and in its topic (broadcasts
//     count as one topic), so that a gap's exact count costs a few index
//     lookups per topic whatever its size. New adds these columns to a
//     database made by an earlier version and numbers its rows, 2,000 per
//     write transaction, before it returns (about 8s a million rows; an
//     interrupted numbering resumes where it stopped); it also replaces the
//     (topic, sequence) index by (topic, sequence, topic_ordinal). Rows an
//     earlier version appends later stay unnumbered (and so do this
//     version's after them) until the next New: counts stay exact, but read
//     row by row meanwhile.
//   - OpenDB(":memory:") pins the pool to one connection, so the whole pool
//     shares one in-memory database and every use is serialised. A file gets
//     WAL, a 10s busy timeout and synchronous=NORMAL.
//   - Input errors from Publish, Replay and the [EventLog] reads wrap
//     [ErrInvalid]; test with errors.Is. Nothing was stored.
//   - After [EventHub.Close], Publish and StartTail return [ErrClosed], and
//     StartRetention returns a stop that does nothing. Close is idempotent,
//     never closes the *sql.DB, and lets a publish already being committed
//     finish.
//   - Publish's ctx bounds the wait, not the write: the commit itself is not
//     cancelled. A ctx already done stores nothing; when ctx ends while the
//     event is being committed, Publish returns ctx's error and the event may
//     or may not have been stored. Give events an id with [WithEventID] and
//     retry: a known id stores nothing and returns the original event.
//   - A []byte payload is taken as raw JSON, like json.RawMessage, not
//     base64-encoded as encoding/json would; it must be valid JSON.
//   - A payload is written as one "data:" line per line. CR, LF and CRLF all
//     end a line for an SSE parser, so a raw JSON payload holding CR or CRLF
//     whitespace reaches an EventSource with LF in their place; LF-only
//     payloads arrive byte for byte. (JSON strings cannot hold raw line
//     breaks, so only insignificant whitespace is affected.)
//   - The SSE topic parameter is trimmed of surrounding white space, so
//     Publish and the reads refuse a topic with leading or trailing white
//     space: no connection could ever subscribe to it.
//   - A stream that cannot start (the hub is closed, or the log cannot be
//     read) is answered 200 with only an SSE comment and ended: an
//     EventSource treats any other status as final and would never
//     reconnect, while an ended stream is retried with the same cursor.
//   - [EventHub.Replay] and the EventLog reads treat limit <= 0 as 100; a
//     negative SSEOptions.ReplayLimit replays nothing (gaps report 0).
//   - The hello and heartbeat event types are fixed ("hello", "heartbeat");
//     the gap's is SSEOptions.GapEventType.
//   - A [EventHub.Subscribe] callback runs on the delivering goroutine, under
//     the hub's delivery lock: it must not block and must not call Publish.
//     For this hub's own publishes it runs before Publish returns.
//   - The tracker ([EventHub.Clients]) also offers ActiveClients(topic),
//     Total and Snapshot; a topic seen once stays in Snapshot and Stats with
//     0 clients.
//   - The hub takes its writer's connection from the pool in New and keeps
//     it (except on a pool of one, ":memory:", where it is lent per batch).
//     SSE log reads (handshakes and replay pages) run at most pool size
//     minus two at a time (at least one; 8 on an unlimited pool), so a storm
//     of connecting clients queues for that limit and leaves a connection
//     free for the live catch-up and the tail.
//   - A resuming client's replay is read and written a page at a time (64
//     events or 64 KiB, at least one event), each page under the usual write
//     deadline, so a connection in replay holds one page besides its live
//     queue (MaxBufferedBytes). The replay window, the gap and the head come
//     from one read snapshot of the index; the pages are read afterwards,
//     and since rows at or below the head can only be pruned, never
//     inserted, a prune watermark above the last event written ends the
//     stream: the client reconnects and is told of the pruned rows in a gap.
package replayd
