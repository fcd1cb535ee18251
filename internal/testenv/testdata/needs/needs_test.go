// Package needs is a fixture for testenv's tests: two tests that need a
// service named by REPLAYD_TESTENV_FIXTURE, and a TestMain that reports.
package needs

import (
	"os"
	"testing"

	"github.com/replayd/replayd/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Report("needs")
	if code == 0 && os.Getenv("REPLAYD_TESTENV_FIXTURE") == "" {
		testenv.NoTestsRan()
	}
	os.Exit(code)
}

func TestOne(t *testing.T) { need(t) }

func TestTwo(t *testing.T) {
	t.Run("Sub", func(t *testing.T) { need(t) })
}

func need(t *testing.T) {
	if got := testenv.Need(t, "the fixture", "export REPLAYD_TESTENV_FIXTURE=1", "REPLAYD_TESTENV_FIXTURE")[0]; got != "1" {
		t.Fatalf("Need returned %q, want the variable's value", got)
	}
}
