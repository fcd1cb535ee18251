package redisserver

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of
// ending the test.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recorder) Skipf(format string, args ...any)  { r.skip = fmt.Sprintf(format, args...) }

// Without redis-server a test skips, and fails under CI.
func TestMissingServer(t *testing.T) {
	t.Setenv("REPLAYD_REDIS_SERVER", "/nonexistent/redis-server")
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		Binary(r)
		if failed := r.fatal != ""; failed != (ci == "true") || (r.skip != "") == failed {
			t.Errorf("CI=%q without redis-server: Fatalf %q, Skipf %q; want a failure under CI, a skip otherwise", ci, r.fatal, r.skip)
		}
	}
}

// A server starts, answers PING, and comes back on its port after a
// kill with what it persisted.
func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	if err := ping(s.Addr); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr
	s.Kill()
	if err := ping(addr); err == nil {
		t.Fatal("PONG after Kill")
	}
	s.Restart()
	if s.Addr != addr {
		t.Fatalf("restarted on %s, was %s", s.Addr, addr)
	}
	if err := ping(s.Addr); err != nil {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
