package headless

import (
	"os"
	"os/exec"
	"testing"
)

// ExecPath returns the Chromium a browser test drives: $REPLAYD_CHROMIUM
// when set, else /usr/bin/chromium, else chromium or chromium-browser on
// PATH. Without one the test is skipped, or fails when
// REPLAYD_BROWSER_TESTS=1 (CI sets it), so a run without a browser never
// looks green there. Every browser test of the tree decides this way.
func ExecPath(t testing.TB) string {
	t.Helper()
	path, msg := lookChromium()
	if path != "" {
		return path
	}
	if os.Getenv("REPLAYD_BROWSER_TESTS") == "1" {
		t.Fatal(msg + " (REPLAYD_BROWSER_TESTS=1)")
		return ""
	}
	t.Skip(msg)
	return ""
}

// lookChromium finds Chromium as ExecPath says, or says why not.
func lookChromium() (path, msg string) {
	if p := os.Getenv("REPLAYD_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", "Chromium not found at $REPLAYD_CHROMIUM: " + err.Error()
		}
		return p, ""
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium", ""
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, ""
		}
	}
	return "", "Chromium not found (/usr/bin/chromium, or chromium on PATH, or $REPLAYD_CHROMIUM); install it with `apt-get install -y chromium` to run the browser tests"
}
