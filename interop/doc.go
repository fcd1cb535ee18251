// Package interop measures how third-party SSE clients cope with the ways a
// replayd stream ends: does the client come back, does it send
// Last-Event-ID, does it resume without a loss or a duplicate, does it hand
// the gap frame to the application.
//
// It holds tests only. They run a real replayd hub (SQLite in a temporary
// directory, a real HTTP server) and drive the clients themselves:
// github.com/r3labs/sse/v2, github.com/launchdarkly/eventsource,
// github.com/tmaxmax/go-sse and the npm package eventsource (through
// Node.js). The results are written down in docs/clients.md at the
// repository's root; the tests assert them, so a client release that
// changes its behaviour makes them fail.
//
//	cd interop && go test ./...
//
// It is a module of its own so that the clients stay out of replayd's
// dependencies. Its directory durable holds the Durable Streams
// conformance harness (npm, run by durable/run.sh) and the round-robin
// proxy for the two-node run (durable/rrproxy, a command of its own);
// see durable/README.md.
package interop
