// Package redisserver starts throwaway redis-server processes for the
// tests of replaydredis: each on a free port of 127.0.0.1, in a
// directory of the test's, stopped when the test ends.
//
// Start skips the test when redis-server is not installed, or fails it
// under CI (CI=true), where a suite that never ran must not look green
// (.ci/run installs Debian's redis-server).
package redisserver

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is a redis-server process of a test.
type Server struct {
	Addr string // host:port
	Dir  string // its working directory: RDB and AOF files
	args []string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited
	t    testing.TB
}

// Binary returns the path of redis-server, or skips t (fails it under CI).
// REPLAYD_REDIS_SERVER names another binary; otherwise redis-server is
// looked up in PATH, then at Debian's /usr/bin/redis-server.
func Binary(t testing.TB) string {
	t.Helper()
	p, err := find()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found under CI: .ci/run did not install it (apt-get install redis-server): %v", err)
		} else {
			t.Skipf("redis-server not found (apt-get install redis-server, or set REPLAYD_REDIS_SERVER): %v", err)
		}
	}
	return p
}

func find() (string, error) {
	if p := os.Getenv("REPLAYD_REDIS_SERVER"); p != "" {
		return exec.LookPath(p)
	}
	p, err := exec.LookPath("redis-server")
	if err == nil {
		return p, nil
	}
	if _, serr := exec.LookPath("/usr/bin/redis-server"); serr == nil {
		return "/usr/bin/redis-server", nil
	}
	return "", err
}

// Start starts a redis-server with the configuration directives args (as
// on its command line: "--appendonly", "yes", ...) added to a throwaway
// one: no RDB snapshots, no AOF, unless args set them.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	s := &Server{Dir: t.TempDir(), args: args, t: t}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// Port is the server's port, as a string.
func (s *Server) Port() string {
	_, p, _ := net.SplitHostPort(s.Addr)
	return p
}

// URL is the server's address as a redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr }

func (s *Server) start() {
	t := s.t
	t.Helper()
	bin := Binary(t)
	var lastErr error
	for range 5 { // a free port may be taken between our look and the server's bind
		port := s.port()
		cmd := exec.Command(bin, append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", s.Dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
			"--logfile", filepath.Join(s.Dir, "redis.log"),
		}, s.args...)...)
		cmd.Dir = s.Dir
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := waitReady(addr, done); err != nil {
			cmd.Process.Kill()
			<-done
			lastErr = err
			continue
		}
		s.Addr, s.cmd, s.done = addr, cmd, done
		return
	}
	log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	t.Fatalf("redis-server did not start: %v\n%s", lastErr, log)
}

// port returns the server's port if it had one (a restart keeps it), else
// a free one.
func (s *Server) port() int {
	if s.Addr != "" {
		_, p, _ := net.SplitHostPort(s.Addr)
		n, _ := strconv.Atoi(p)
		return n
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitReady waits, at most 10 s, until the server at addr answers PING
// with PONG, or its process exits.
func waitReady(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			return errors.New("redis-server exited")
		default:
		}
		if err := ping(addr); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("no PONG from %s within 10s: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond) // polling a port that is not yet open: no signal to wait on
	}
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING: %q", line) // -LOADING while it reads its files
	}
	return nil
}

// Kill kills the server with SIGKILL (a crash: nothing flushed) and waits
// for it to exit.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Restart starts the server again on the same port and directory, with the
// same configuration: it loads what it had persisted there.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("redisserver: Restart of a running server")
	}
	s.start()
}

// Stop kills the server if it runs.
func (s *Server) Stop() { s.Kill() }
