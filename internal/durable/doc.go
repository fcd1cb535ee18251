// Package durable serves the Durable Streams protocol
// (https://github.com/durable-streams/durable-streams) over a hub's log:
// a stream is a topic, an offset is a sequence, and a stream's metadata and
// its idempotent producers' state commit in the same transaction as its
// events (storage.StreamStore). The root package's
// EventHub.DurableStreams builds a Handler from a Config; docs/durable-streams.md
// says how the two models meet.
//
// One concept per file: handler.go (routing, common headers, errors),
// path.go (path → topic), offset.go, meta.go (a stream's record),
// create.go (PUT), appendreq.go (POST), producer.go, read.go (GET
// catch-up), longpoll.go, sse.go, head.go, delete.go and sweep.go (what
// deleted and expired streams leave, reclaimed).
package durable
