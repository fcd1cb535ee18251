package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// goTest runs go test with args on the fixture package, with env added to
// a copy of the environment that has neither the fixture's variable nor
// CI, and returns its output and whether it passed.
func goTest(t *testing.T, env []string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command("go", append(append([]string{"test", "-count=1"}, args...), "./testdata/needs")...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CI=") && !strings.HasPrefix(kv, "REPLAYD_TESTENV_FIXTURE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return string(out), err == nil
}

// Without the service, go test ./... must not print a bare "ok": the
// summary line says no test ran, and the package's output says, once,
// how many tests skipped and what to set.
func TestSkippedRunSaysSo(t *testing.T) {
	out, ok := goTest(t, nil)
	if !ok || !strings.Contains(out, "[no tests to run]") {
		t.Errorf("go test without the service: passed %v, output\n%s\nwant a pass whose summary says [no tests to run]", ok, out)
	}
	out, ok = goTest(t, nil, "-v")
	want := "needs: 2 tests skipped: they need the fixture: set REPLAYD_TESTENV_FIXTURE (or run `export REPLAYD_TESTENV_FIXTURE=1`)\n"
	if !ok || strings.Count(out, want) != 1 {
		t.Errorf("go test -v without the service: passed %v, output\n%s\nwant a pass saying once: %s", ok, out, want)
	}
}

// Under CI a missing service fails the run.
func TestSkippedRunFailsUnderCI(t *testing.T) {
	out, ok := goTest(t, []string{"CI=true"})
	if ok || !strings.Contains(out, "REPLAYD_TESTENV_FIXTURE not set under CI") {
		t.Errorf("go test under CI without the service: passed %v, output\n%s\nwant a failure naming the variable", ok, out)
	}
}

// With the service, the tests run and nothing is reported.
func TestServicePresentRunsQuietly(t *testing.T) {
	out, ok := goTest(t, []string{"REPLAYD_TESTENV_FIXTURE=1"}, "-v")
	if !ok || strings.Contains(out, "skipped") || strings.Contains(out, "no tests to run") || strings.Count(out, "--- PASS") != 3 {
		t.Errorf("go test -v with the service: passed %v, output\n%s\nwant 3 passes and no report", ok, out)
	}
}
