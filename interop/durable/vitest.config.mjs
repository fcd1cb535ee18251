import { defineConfig } from "vitest/config"

// One file, ours; the suite's own files under node_modules stay out.
export default defineConfig({
  test: {
    include: ["conformance.test.mjs"],
    passWithNoTests: false,
    // A few tests wait out a long poll with no timeout of their own, so the
    // server's full hold (30 s for the reference server and for replayd)
    // must fit in the default; others set their own.
    testTimeout: 60_000,
    hookTimeout: 30_000,
  },
})
