package headless

import (
	"fmt"
	"path/filepath"
	"testing"
)

// recorder is a testing.TB that records Skip and Fatal instead of ending
// the goroutine.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatal(args ...any) { r.failed = fmt.Sprint(args...) }

// ExecPath: a Chromium found is used whatever REPLAYD_BROWSER_TESTS says;
// none found skips, or fails with REPLAYD_BROWSER_TESTS=1.
func TestExecPath(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-chromium")
	for _, tc := range []struct {
		chromium, mandatory string
		wantPath            string
		wantSkip, wantFail  bool
	}{
		{chromium: "/bin/sh", wantPath: "/bin/sh"},
		{chromium: "/bin/sh", mandatory: "1", wantPath: "/bin/sh"},
		{chromium: missing, wantSkip: true},
		{chromium: missing, mandatory: "1", wantFail: true},
	} {
		t.Setenv("REPLAYD_CHROMIUM", tc.chromium)
		t.Setenv("REPLAYD_BROWSER_TESTS", tc.mandatory)
		r := &recorder{TB: t}
		got := ExecPath(r)
		if got != tc.wantPath || (r.skipped != "") != tc.wantSkip || (r.failed != "") != tc.wantFail {
			t.Errorf("REPLAYD_CHROMIUM=%s REPLAYD_BROWSER_TESTS=%q: path %q, skipped %q, failed %q; want path %q, skip %v, fail %v",
				tc.chromium, tc.mandatory, got, r.skipped, r.failed, tc.wantPath, tc.wantSkip, tc.wantFail)
		}
	}
}
