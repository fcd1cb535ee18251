// Package replaydmcp is a durable, multi-process event store for MCP
// servers written with the official Go SDK
// (github.com/modelcontextprotocol/go-sdk): an [mcp.EventStore] on a replayd
// log, so that a client's streamable-HTTP streams resume with Last-Event-ID
// after the server restarts, or on another server process over the same log
// (a shared SQLite file, or PostgreSQL through module
// github.com/replayd/replayd/replaydpg). The SDK's own store,
// [mcp.MemoryEventStore], lives in one process's memory.
//
//	db, _ := sqlitestore.OpenDB("mcp.db")
//	log, _ := sqlitestore.Open(db, sqlitestore.Options{})
//	events := replaydmcp.New(log, replaydmcp.Options{
//		Retention: storage.RetentionPolicy{MaxAge: time.Hour},
//	})
//	handler := replaydmcp.NewHandler(getServer, events, nil) // wraps mcp.NewStreamableHTTPHandler
//	defer handler.Close()
//
// The event store keeps the interface's contract: After returns every datum
// appended after an index, in order, or an error ([mcp.ErrEventsPurged] when
// some was pruned), never part of them. See [EventStore] for how retention
// and SessionClosed work on a log that deletes only its oldest events.
//
// A store alone does not make the SDK's handler resume a session it did not
// start: mcp.StreamableHTTPHandler keeps its sessions in memory and answers
// 404 to any other session id, which its client takes for a session gone.
// [Handler] wraps it and serves such a session from the log (see its doc).
// docs/mcp.md says what resumes across a restart and across nodes, what
// the tests show, and what it costs.
package replaydmcp
