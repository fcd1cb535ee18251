// Package testenv lets a test need a service the machine may lack (a
// PostgreSQL, a PgBouncer) and makes a run without it say so, instead of
// reading as a pass.
//
// Need skips a test whose service is not running, or fails it under CI
// (CI=true), where a suite that never ran must not look green. A package's
// TestMain calls Report once its tests have run: one line per missing
// service, with how many tests it skipped and what to set, e.g.
//
//	replaydpg: 91 tests skipped: they need PostgreSQL: set REPLAYD_PG_DSN (or run `source .ci/pg.sh`)
//
// go test shows a passing package's output only with -v or when run in
// the package's directory without arguments; Report's NoTestsRan marks the
// summary line of `go test ./...` as well.
package testenv

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

var (
	mu      sync.Mutex
	skipped = map[string]*need{} // by the first variable's name
	order   []string
)

// need is a service some tests skipped without.
type need struct {
	what, start string
	names       []string
	tests       map[string]bool
}

// Need returns the values of the environment variables names, which are
// set once what is running (started as start says). If one is empty, the
// test fails under CI (CI=true) and is skipped otherwise, and Report
// counts it.
func Need(t testing.TB, what, start string, names ...string) []string {
	t.Helper()
	vals := make([]string, len(names))
	var missing []string
	for i, name := range names {
		if vals[i] = os.Getenv(name); vals[i] == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return vals
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not set under CI: %s did not start %s", strings.Join(missing, ", "), start, what)
	}
	mu.Lock()
	n := skipped[names[0]]
	if n == nil {
		n = &need{what: what, start: start, names: names, tests: map[string]bool{}}
		skipped[names[0]] = n
		order = append(order, names[0])
	}
	n.tests[t.Name()] = true
	mu.Unlock()
	t.Skipf("%s not set; start %s with: %s", strings.Join(missing, ", "), what, start)
	return nil
}

// Report prints, for each service tests of pkg skipped without, one line:
// how many tests, and what to set.
func Report(pkg string) {
	mu.Lock()
	defer mu.Unlock()
	for _, key := range order {
		n := skipped[key]
		count := fmt.Sprintf("%d tests skipped: they need", len(n.tests))
		if len(n.tests) == 1 {
			count = "1 test skipped: it needs"
		}
		fmt.Printf("%s: %s %s: set %s (or run `%s`)\n",
			pkg, count, n.what, strings.Join(n.names, ", "), n.start)
	}
}

// NoTestsRan prints the line by which the testing package tells go test
// that no test ran, so that go test's summary line for the package reads
// "ok ... [no tests to run]" rather than a bare "ok", even in package list
// mode (go test ./...), which shows nothing else of a passing package. A
// TestMain calls it when every test of the package needed a missing
// service.
func NoTestsRan() {
	fmt.Println("testing: warning: no tests to run")
}
