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
// [EventHub.Handler] is the SSE endpoint; PROTOCOL.md in the repository
// describes everything it accepts and sends: frames, hello, gaps, cursors,
// scopes and status codes. The topic is the "topic" query parameter
// (trimmed), which may be repeated to open several topics on one connection
// (?topic=a&topic=b: their events and broadcasts); the cursor is the
// Last-Event-ID header, or failing that
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
// # Who may see what
//
// [Options].Authorize, when set, decides every stream request before
// anything is read from the log, given the scope's topics (none for the
// global scope). A nil error grants exactly that scope; an error refuses the
// request, 401 when it wraps [ErrUnauthenticated], else 403, with a fixed
// body. Access is revoked with [WithRevocation]: middleware puts on the
// request a context that ends with the user's access (a session's, a
// membership's), and once it is done the stream ends, detached or not, and
// a waiting long poll is answered with no events, as if its wait ran out;
// the client comes back and Authorize decides again. A stream also ends
// when its request's context is done.
// SSEOptions.MaxConnections caps the open streams: past it a request gets
// 200 with only a retry field, and an EventSource comes back by itself
// between 1x and 2x SSEOptions.OverloadRetry later.
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
// stream so that its clients reconnect and get a gap, and tells each
// [EventHub.SubscribeWithGaps] subscriber with a [Gap] before the next event.
// If the head falls below the live position (the log was reset or replaced
// from outside), the hub logs a warning, ends every stream (their clients
// reconnect with an "unknown_cursor" gap and go on from the new head), tells
// gap subscribers with an "unknown_cursor" Gap, and follows the new log: it
// notices at its next tail poll or publish, never waiting for the sequence to
// pass its old position.
//
// A publish never waits on an SSE client. Each connection has a queue of
// unsent frames bounded by SSEOptions.MaxBufferedBytes (default 1 MiB) and
// each write must finish within 7.5-15s; a client past either limit is
// disconnected (logged at Info with its topics and address), which is safe
// because it resumes from the log. The cap applies once something is
// unsent: an empty queue always takes one frame, so the largest event
// Publish accepts (a 1 MiB payload, whose frame grows by a "data: " line
// per line of the payload) never cuts a client that keeps up.
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
//   - Storage is a [Store]: New is [NewWithStore] over the SQLite store
//     ([NewSQLiteStore]); the hub closes that store (its writer's
//     connection) on Close, but never a Store given to NewWithStore, nor the
//     *sql.DB. Capabilities beyond the contract are small optional
//     interfaces the hub looks for: [Notifier] (StartTail is woken by
//     appends; the interval becomes the fallback poll), [SchemaEnsurer]
//     (EnsureSchema; without it EnsureSchema does nothing) and [WriteProber]
//     (Ready; without it Ready reads the head only). The SQLite file-identity
//     guard ([ErrLogReplaced]) works only over the SQLite store.
//   - The SQLite store serialises its own writes (appends, prune batches,
//     schema, the Ready probe); a batch that fails on one row is committed
//     again event by event inside the store, so only that event's Publish
//     fails (AppendResult.Err). The hub then delivers each stored event of
//     that batch on its own, since other processes may have committed rows
//     between them.
//   - Live delivery reads the log (to catch up on other processes' rows)
//     without holding the lock under which rows are dispatched: a second
//     mutex orders deliveries, so a slow read delays only the deliveries
//     behind it.
//   - [EventLog.ReplayLatest] reads where the window starts, then the
//     window, in two snapshots: should retention delete part of it in
//     between, it returns what is left.
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
//     never closes the *sql.DB, and returns within about a second whatever
//     another process does: it lets a publish already being committed finish
//     for up to half a second, then cancels the commit (those publishes
//     return [ErrClosed]; nothing was stored). Only if the writer does not
//     stop a second after that does Close give up on it, returning an error,
//     and its publishes return [ErrOutcomeUnknown].
//   - Publish's ctx bounds the wait, not the write: the commit itself is not
//     cancelled. A ctx already done stores nothing; when ctx ends while the
//     event is being committed, Publish returns an error wrapping
//     [ErrOutcomeUnknown] and ctx's error: the event may or may not have been
//     stored. Give events an id with [WithEventID] and retry: a known id
//     stores nothing and returns the original event. An error wrapping
//     [ErrClosed] means nothing was stored.
//   - A group-commit batch that fails on one row (a constraint, such as a
//     trigger's RAISE, or a value SQLite refuses) is retried one event at a
//     time, so only the bad event fails. Any other failure (busy past the
//     busy timeout, I/O) fails the whole batch at once: retrying each event
//     would repeat the same wait once per event.
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
//   - A stream whose http.ResponseWriter cannot flush (neither it nor a
//     writer its Unwrap method returns implements http.Flusher, as
//     http.ResponseController needs) is refused with 500 and a plain-text
//     reason before anything is read; the cause is logged at Error once per
//     hub. Unlike a stream that fails while starting, it is not answered
//     200: it could never work, so no client should retry it.
//   - Deleting the database file under a running hub, or moving another
//     file over it, is an operator error that SQLite does not notice. The
//     hub remembers the main database file (its path from PRAGMA
//     database_list; device and inode, see os.SameFile) and looks at the
//     path again before a commit (at most every 100ms), after a failed
//     commit and on every tail poll. Once it is not the same file, the hub
//     logs that at Error and every Publish fails with an error wrapping
//     [ErrLogReplaced]; publishes acknowledged in the 100ms before went into
//     the old file and are lost. The hub does not recover: close it and the
//     *sql.DB, restore the file, and open both again. ":memory:" has no file
//     and is not checked.
//   - [EventHub.Replay] and the EventLog reads treat limit <= 0 as 100; a
//     negative SSEOptions.ReplayLimit replays nothing (gaps report 0).
//   - [EventHub.Prune] on a closed hub deletes nothing and returns
//     ErrClosed, like Publish; a prune that Close overtakes and whose store
//     then fails (closed by its owner after the hub) returns ErrClosed too.
//   - SSEOptions.Retry is sent as a retry field in the hello's block
//     ("retry: 2000\nid: 7\nevent: hello\ndata: …"), not as a block of its
//     own: r3labs/sse and tmaxmax/go-sse hand a block holding only retry to
//     the application as an empty event. An EventSource reads it the same
//     either way.
//   - The hello and heartbeat event types are fixed ("hello", "heartbeat");
//     the gap's is SSEOptions.GapEventType.
//   - A [EventHub.Subscribe] callback runs on the delivering goroutine, under
//     the hub's delivery lock: it must not block and must not call Publish.
//     For this hub's own publishes it runs before Publish returns.
//   - An in-process subscriber learns of holes through
//     [EventHub.SubscribeWithGaps] (Subscribe's signature is fixed): a [Gap]
//     with the SSE reasons "pruned" and "unknown_cursor", plus "unreadable"
//     for rows a database error kept from being read (an SSE client gets a
//     stream that ends, then the gap its cursor earns on reconnecting).
//   - [ClientScript] serves the module with a strong ETag (a hash of its
//     bytes) and Cache-Control no-cache, answers If-None-Match with 304 and
//     any method but GET and HEAD with 405.
//   - The browser module: a cursor stored under storageKey wins over the
//     cursor option (it is what the tab saw last). transport defaults to
//     "auto" when both URLs are given, else to the one given. Topics are
//     always sent as "topic" parameters (the default TopicParam). A fresh
//     poll subscription first polls with wait=0 to learn the head, so that
//     a reload before any event loses nothing. After an unknown_cursor gap
//     the cursor moves back to the head the server names, and ids continue
//     from there (strictly increasing again from the gap on). Events of
//     types not asked for move the cursor without reaching onEvent.
//   - Any query that does not parse (url.ParseQuery fails, for example on a
//     ";" separator or a bad escape) is refused with 400, whichever
//     parameter is malformed: net/url would drop the pair, and a dropped
//     topic would widen the scope.
//   - Authorize gets its own copy of the topics, nil for the global scope.
//     It is not called for OPTIONS, nor for a request already refused by
//     the method, origin, topic or connection checks. A 401 carries no
//     WWW-Authenticate header: the scheme is the application's, so wrap
//     the handler to add one.
//   - A request holds its connection slot from admission, before Authorize
//     runs, until its stream ends; a refused request gives it back at once.
//     HEAD is admitted like GET and answers the same status, holding no
//     slot once answered.
//   - The overload answer is "retry: <ms>" and the comment
//     ": server busy, retry later", then the response ends; it counts under
//     the "overload" refusal reason.
//   - [EventHub.Metrics] is a lock-free snapshot of counters and histograms
//     that never reads the log; the head gauge is read apart, at scrape
//     time, with LatestSequence: the log's head (what hello frames carry,
//     other processes' writes included) rather than the hub's live
//     position, which lags other writers. replaydprom leaves the head out
//     of a scrape whose read fails, so the other metrics stay visible.
//   - The tail lag is measured from the newest delivered row's created_at,
//     the writer's clock in milliseconds taken just before its insert:
//     exact to about a millisecond plus the writer's transaction, since
//     writers of one SQLite file share the host's clock. Negative ages
//     (a clock stepped back) count as 0.
//   - [EventHub.Ready] checks a read of the head and the write lock
//     (BEGIN IMMEDIATE, ROLLBACK on the writer's connection, queued behind
//     this hub's commits); it writes nothing and cannot detect a full disk.
//   - The poll endpoint ([EventHub.PollHandler]) answers GET and OPTIONS
//     only (HEAD gets 405, as any other method). It always sends
//     Access-Control-Expose-Headers: Retry-After, so a cross-origin page
//     can read the delay of a 503. A poll that arrives while the hub is
//     closing gets 503; one already waiting gets its 200 with no events.
//     A poll whose log read fails gets 503, Retry-After and {"error":…}
//     (never an answer's shape), logged at Error ("replayd: read the log
//     for a poll"); no metric counts it. An answer holds at most limit
//     events and no further one once they hold 4 MiB of payload (at least
//     one; PollOptions); one over 32 KiB is streamed, chunked, with its
//     payloads checked before the status is sent.
//     A waiting poll woken by an event it then does not find above its
//     cursor (one already answered) keeps waiting, within the same wait.
//     Polls are not SSE connections: the tracker does not count them, the
//     connections metric does (transport "poll") while they wait.
//   - The tracker ([EventHub.Clients]) also offers ActiveClients(topic),
//     Total and Snapshot. A topic stays in Snapshot and Stats with 0 clients
//     after its last client leaves, until it has been idle for more than an
//     hour or is not among the newest 10,000 idle topics (clients choose
//     topic names, so the tracker must not keep them all). Dropping is done
//     as connections open and close and when Snapshot runs, so Stats costs
//     at most the open topics plus 10,000 entries.
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
//   - SSEOptions.DetachConnections takes an HTTP/1.1 stream's connection
//     over from net/http (http.Hijacker) once the request is admitted; the
//     handler returns and the stream runs on one goroutine of its own, so an
//     idle stream costs well under half its net/http memory (BENCHMARKS.md,
//     c100k). HTTP/2, a ResponseWriter that cannot hijack (a middleware's
//     without Unwrap) and a closed hub are served as before, automatically.
//     The response is framed by the connection's end ("Connection: close",
//     no Content-Length, no chunked encoding): RFC 9112 §6.3 lets any
//     HTTP/1.x client and proxy read it; it costs no bytes per write; nginx,
//     HAProxy and Envoy re-frame it for their own clients; and an SSE stream
//     has no natural end a chunked terminator would mark (it ends, the client
//     reconnects). A TLS stream is closed under its TLS layer, without
//     close_notify (that write can wait 5s on a client that stopped
//     reading).
//   - A detached stream is no longer the http.Server's: Shutdown does not
//     wait for it and Close does not end it. Shut down with the hub's Close
//     first (it ends every stream, closes their connections and waits for
//     their goroutines), then the server's Shutdown. Middleware that wraps the
//     ResponseWriter sees the request but not the stream's bytes, and ending
//     the request's context does not end a detached stream: net/http ends
//     that context when the handler returns, so a middleware that times a
//     stream out, or revokes access, by cancelling it cannot reach a
//     detached stream. Revoke with WithRevocation instead, which reaches
//     both (see "Who may see what" in the README). The hub keeps the
//     request's context values, and the request without its headers, which
//     were read at admission. A MaxConnections slot is held until the
//     detached stream ends. A detached stream that ends before its first
//     write (its client left, or its access was revoked, during the
//     handshake) still sends its head, as net/http does for a handler that
//     wrote nothing.
//   - A stream watches its request's revocation contexts (WithRevocation)
//     with context.AfterFunc while it runs and unregisters when it ends, so
//     a session's context shared by many short streams holds nothing of
//     theirs; a context already done ends the stream right after it starts.
//     A long poll watches them only while it waits: a poll that has events
//     to answer answers them. The select that ends a stream on revocation
//     may still send a frame already due, as when its client leaves.
//   - Nothing reads a detached connection, so its client's leaving is not
//     seen by net/http. On Linux one epoll instance per process (one
//     goroutine, started with the first detached stream and stopped with the
//     last) watches every detached socket for the client's FIN or reset and
//     cancels the stream at once, as net/http does: the tracker, the
//     connection gauge and MaxConnections drift by nothing. Elsewhere a write
//     that follows a second of silence first reads the socket without
//     blocking, so a client that left is seen at the next heartbeat at the
//     latest (at most HeartbeatInterval, default 15s; with heartbeats off,
//     at the next event): without that check a write to a closed socket
//     succeeds once and only the write after it fails.
package replayd
