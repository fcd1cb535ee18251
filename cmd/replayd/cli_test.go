package main_test

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A bad flag or value exits with status 2 and one line on stderr naming
// the flag.
func TestBadFlagsExitTwo(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("too short"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		flag string // the stderr line names it
	}{
		{"unknown flag", nil, []string{"--bogus"}, "--bogus"},
		{"bad size", nil, []string{"--max-body", "lots"}, "--max-body"},
		{"bad duration in the environment", []string{"REPLAYD_HEARTBEAT=soon"}, nil, "REPLAYD_HEARTBEAT"},
		{"db and postgres", nil, []string{"--db", "x.db", "--postgres", "postgres://x"}, "--postgres"},
		{"empty key", nil, []string{"--publish-key", "=room-*"}, "--publish-key"},
		{"star inside a pattern", nil, []string{"--publish-key", "k=ro*m"}, "--publish-key"},
		{"base64 key alone", nil, []string{"--publish-key", "c2VjcmV0a2V5Zm9ycHVibGlzaA=="}, "--publish-key"},
		{"ambiguous key", []string{"REPLAYD_PUBLISH_KEY=k=a=b"}, nil, "--publish-key"},
		{"negative idle timeout", nil, []string{"--idle-timeout", "-1s"}, "--idle-timeout"},
		{"missing publish key file", nil, []string{"--publish-key-file", filepath.Join(dir, "absent")}, "--publish-key-file"},
		{"bad public pattern", nil, []string{"--public-topics", "a,,b"}, "--public-topics"},
		{"log level", nil, []string{"--log-level", "loud"}, "--log-level"},
		{"missing token key", nil, []string{"--token-key", filepath.Join(dir, "absent")}, "--token-key"},
		{"short secret", nil, []string{"--token-key", short}, "--token-key"},
		{"issuer without a key", nil, []string{"--token-issuer", "me"}, "--token-issuer"},
		{"stray argument", nil, []string{"extra"}, "extra"},
		{"bad listen address", nil, []string{"--listen", "nowhere:-1"}, "--listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--db", filepath.Join(t.TempDir(), "e.db")}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; stderr: %s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.flag) {
				t.Fatalf("stderr %q: want one line naming %s", stderr.String(), tc.flag)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil || !strings.HasPrefix(string(out), "replayd ") {
			t.Errorf("replayd %s: %v %q", arg, err, out)
		}
	}
	if err := exec.Command(bin).Run(); err == nil {
		t.Error("replayd without a command: exit status 0")
	}
}

// A flag on the command line wins over its environment variable.
func TestFlagWinsOverEnvironment(t *testing.T) {
	d := start(t, []string{"REPLAYD_PUBLISH_KEY=env-a env-b=room-*", "REPLAYD_MAX_BODY=1"}, "--db", filepath.Join(t.TempDir(), "f.db"), "--max-body", "1KiB")
	if status, b := post(t, http.DefaultClient, d.base, "env-a", "", `{"data":1}`); status != 200 {
		t.Errorf("key from the environment: %d %s", status, b)
	}
	if status, b := post(t, http.DefaultClient, d.base, "env-b", "", `{"topic":"other","data":1}`); status != 403 {
		t.Errorf("second key from the environment publishing outside its pattern: %d %s", status, b)
	}
}

// -h and --help print the command's usage and every flag's description to
// stdout and exit 0, for each command, as `replayd help COMMAND` does.
func TestHelpExitsZero(t *testing.T) {
	flags := map[string][]string{
		"serve":   {"-publish-key", "-token-key", "-replay-limit"},
		"tail":    {"-state", "a file keeping the cursor across runs", "-transport", "-cursor"},
		"publish": {"-key", "the publish key (required)", "-data", "-id"},
	}
	for cmd, want := range flags {
		for _, args := range [][]string{{cmd, "--help"}, {cmd, "-h"}, {"help", cmd}, {cmd, "http://x", "--topic", "a", "-h"}} {
			if cmd == "serve" && len(args) > 3 {
				continue // serve takes no URL
			}
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				c := exec.Command(bin, args...)
				c.Stdout, c.Stderr = &stdout, &stderr
				if err := c.Run(); err != nil {
					t.Fatalf("exit: %v, want 0; stderr: %s", err, stderr.String())
				}
				out := stdout.String()
				if !strings.HasPrefix(out, "Usage: replayd "+cmd) || stderr.Len() != 0 {
					t.Fatalf("stdout %q, stderr %q: want the usage on stdout only", out, stderr.String())
				}
				for _, w := range want {
					if !strings.Contains(out, w) {
						t.Errorf("usage lacks %q:\n%s", w, out)
					}
				}
			})
		}
	}
	for _, arg := range []string{"--help", "-h", "help"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil || !strings.Contains(string(out), "replayd tail URL") || !strings.Contains(string(out), "--help") {
			t.Errorf("replayd %s: %v %q", arg, err, out)
		}
	}
}
