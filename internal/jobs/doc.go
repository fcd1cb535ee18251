// Package jobs is the machinery of job streams (SPEC §20): an upstream's
// output (text chunks, ordered structured events, a progress snapshot)
// written into a Durable Stream, one per job, with a lifecycle kept in
// the stream's record (internal/durable's AppTx hook), so that a job is
// started once on any node, survives reloads, restarts and nodes, and ends
// complete or error, never streaming for ever. The root package's jobs.go
// is its public face; docs/jobs.md says how it works.
package jobs
