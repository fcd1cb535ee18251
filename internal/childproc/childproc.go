// Package childproc runs the test binary again as a child process, for the
// tests whose claims need a second OS process: a crash, another writer on
// the same file, another node on the same database. The child runs one test
// function, which learns from an environment variable that it is the child.
package childproc

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Proc is a running child test process.
type Proc struct {
	// Stdin is the child's standard input; Wait closes it.
	Stdin io.WriteCloser

	t      testing.TB
	cmd    *exec.Cmd
	stderr buffer
	read   chan struct{} // closed once stdout is read to the end
	once   sync.Once
}

// Start re-executes the running test binary with only the test named and
// env added. out reads the child's stdout on a goroutine of its own; once
// out returns, the rest of stdout is discarded (so a child writing after
// its parent stopped listening gets no EPIPE and no hang). The child is
// killed and reaped when the test ends.
func Start(t testing.TB, test string, out func(stdout io.Reader), env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{t: t, cmd: cmd, read: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.Stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.read)
		if out != nil {
			out(stdout)
		}
		io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		p.Kill()
		p.Wait()
	})
	return p
}

// Kill sends SIGKILL (Process.Kill); a child that has exited already is
// not an error.
func (p *Proc) Kill() {
	if err := p.cmd.Process.Kill(); err != nil && !strings.Contains(err.Error(), "finished") {
		p.t.Errorf("kill child: %v", err)
	}
}

// Wait closes the child's stdin, waits until its stdout is read to the end
// and reaps it, once; it returns its state.
func (p *Proc) Wait() *os.ProcessState {
	p.once.Do(func() {
		p.Stdin.Close()
		<-p.read
		p.cmd.Wait()
	})
	return p.cmd.ProcessState
}

// Stderr returns the first 64 KiB the child wrote to stderr.
func (p *Proc) Stderr() string { return p.stderr.String() }

// buffer keeps the first 64 KiB written to it; safe for the exec goroutine
// and the test.
type buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() < 64<<10 {
		b.b.Write(p)
	}
	return len(p), nil
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
