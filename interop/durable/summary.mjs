// Prints the counts of a vitest JSON report (run.sh writes one) as one
// line, "conformance: N passed, N failed, N skipped", after the failed
// tests' names. Usage: node summary.mjs REPORT.json
import { readFileSync } from "node:fs"

const r = JSON.parse(readFileSync(process.argv[2], "utf8"))
for (const file of r.testResults) {
  for (const t of file.assertionResults) {
    if (t.status === "failed") {
      console.log(`  failed: ${t.ancestorTitles.slice(1).join(" > ")} > ${t.title}`)
    }
  }
}
console.log(
  `conformance: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`,
)
