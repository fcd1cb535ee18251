// The Durable Streams server conformance suite, run through its exported
// runConformanceTests against the server at CONFORMANCE_TEST_URL (its root:
// the suite adds /v1/stream/... itself). The package's own CLI cannot be
// used: its default include pattern skips test files under node_modules,
// where its runner lives. run.sh sets the variable; see README.md.
import { describe } from "vitest"
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) {
  throw new Error("CONFORMANCE_TEST_URL is required (the server's base URL); use run.sh")
}

describe(`Durable Streams conformance at ${baseUrl}`, () => {
  runConformanceTests({ baseUrl: baseUrl.replace(/\/+$/, "") })
})
