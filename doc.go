// Package replayd serves Server-Sent Events that survive dropped
// connections, from a durable append-only log.
//
// Every published event is appended to the log (a SQLite file by default,
// PostgreSQL through the module github.com/replayd/replayd/replaydpg), and
// its sequence in the log is its SSE id. When a browser's EventSource
// reconnects it sends the last id it saw as Last-Event-ID; replayd treats
// it as a cursor into the log and sends the client what it missed, in
// order, then the live stream. There is no broker: the log is the only
// shared state, so a server restart, a redeploy or a second process loses
// nothing a client could resume from. You bring the HTTP server and the
// payloads; replayd owns the log, replay, per-topic fan-out, retention and
// tailing across processes and nodes.
//
// # The guarantee
//
// On every connection ids strictly increase with no duplicates, and every
// event of the connection's scope above its starting cursor is either
// delivered or named by a gap frame that arrives before any later event:
// contiguity or an explicit gap, never a silent hole.
//
// # A server
//
//	db, err := replayd.OpenDB("events.db") // WAL, busy timeout; pure Go
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer db.Close() // the hub never closes the database
//
//	hub, err := replayd.New(db, replayd.Options{}) // creates the schema
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer hub.Close()
//
//	mux := http.NewServeMux()
//	mux.Handle("/events", hub.Handler())              // SSE: GET /events?topic=room-42
//	mux.Handle("/poll", hub.PollHandler())            // the same log as JSON long polls
//	mux.Handle("/replayd.js", replayd.ClientScript()) // the browser module
//
//	// Anywhere: returns once the event is durably committed.
//	_, err = hub.Publish(ctx, "room-42", map[string]string{"text": "hi"})
//
// Zero [Options] are the defaults. [EventHub.StartRetention] bounds the log;
// [EventHub.StartTail] delivers events other processes or nodes append.
//
// # Topics and scopes
//
// An event is published on a topic, or on "" (a broadcast). A connection
// names its scope with the topic query parameter, repeated for several
// topics on one connection (?topic=a&topic=b): it sees the events of those
// topics and every broadcast. A connection with no topic is global and sees
// every event. The same rule decides live delivery, replay and gaps.
// [Options].Authorize decides which scopes a request may open, and
// [WithRevocation] ends streams when access ends.
//
// # Cursors and gaps
//
// Sequences only grow, never repeat, and need not be contiguous: a jump in
// ids is never a loss. Each stream starts with a hello frame whose id is its
// cursor (the client's, or the head for a fresh client). A client resuming
// at cursor c is replayed the events of its scope above c, at most
// SSEOptions.ReplayLimit (default 100) of them; when it cannot have them
// all, one gap frame, with no id, comes first and names what is missing:
//
//   - "replay_limit": more events were missed than the replay limit; the
//     newest are replayed and the gap names the older ones exactly;
//   - "pruned": retention deleted events above the cursor;
//   - "unknown_cursor": the cursor is not one this log handed out (above
//     the head, or from another history: see below); the stream continues
//     from the head;
//   - "invalid_cursor": the cursor is not a decimal integer; the stream
//     continues from the head.
//
// A log never issues a sequence twice, across restores from a backup,
// rebuilds and restarts: whenever a log is opened its head is raised to the
// clock in Unix microseconds and the skipped range is recorded, so a new
// log's first ids are near 1.8e15 (exact as JavaScript numbers until the
// year 2255), and a cursor a restored log never issued gets
// "unknown_cursor" instead of someone else's history. docs/restore.md tells
// how to restore a log and what clients see.
//
// A client treats any gap as "re-sync from a snapshot". In-process,
// [EventHub.Subscribe] receives every event delivered live, and
// [EventHub.SubscribeWithGaps] also each hole, as a [Gap].
//
// # Storage
//
// [New] runs the hub over a SQLite database from [OpenDB]: one process, or
// several processes on one machine sharing the file. [NewWithStore] runs it
// over any [Store], such as replaydpg's PostgreSQL store for several nodes
// behind a load balancer. The Store documentation is the contract a backend
// keeps; the packages storetest, hubtest and chaostest are the tests every
// backend runs.
//
// # Read on
//
// In the repository: README.md (a demo: go run ./examples/basic),
// PROTOCOL.md (the wire format, for client authors), docs/browser.md (the
// browser module and polling), docs/authorization.md, docs/operations.md
// (several processes and nodes, sizing, metrics, logs), docs/backends.md,
// docs/testing.md (the guarantees and the tests that prove them) and
// docs/design.md (how it works inside, for maintainers).
package replayd
