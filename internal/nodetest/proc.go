package nodetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/childproc"
)

// Proc is a node process (see internal/childproc) running Node.Run, as
// its parent reads it.
type Proc struct {
	*childproc.Proc
	Name    string
	Addr    chan string   // its address, once it serves
	Stopped chan struct{} // closed once it has stopped publishing
	// PrunedOnce is closed at the first prune that deleted rows.
	PrunedOnce chan struct{}

	mu     sync.Mutex
	pruned int64
	acks   int
	fails  int
	first  []string      // the first fail lines
	ackC   chan struct{} // signalled at every ack
}

// StartNode re-executes the test binary, running only test, with env
// added (the test learns from it that it is a node); the node's attempts
// and acknowledgements go to tr's ledger as they arrive. extra, if not
// nil, takes a line of the test's own (its fields); it returns false for
// a line it does not know either, which tr records as a failure.
func StartNode(t *testing.T, tr *Truth, test, name string, extra func(f []string) bool, env ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Addr: make(chan string, 1), Stopped: make(chan struct{}), PrunedOnce: make(chan struct{}), ackC: make(chan struct{}, 1)}
	p.Proc = childproc.Start(t, test, func(stdout io.Reader) {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "addr":
				p.Addr <- f[1]
			case len(f) == 2 && (f[0] == "try" || f[0] == "ack"):
				var ev replayd.Event
				if err := json.Unmarshal([]byte(f[1]), &ev); err != nil {
					tr.Fail("%s: %q: %v", name, sc.Text(), err)
					continue
				}
				if f[0] == "try" {
					tr.Ledger.Attempted(ev)
					continue
				}
				tr.Ledger.Published(ev)
				p.mu.Lock()
				p.acks++
				p.mu.Unlock()
				select {
				case p.ackC <- struct{}{}:
				default:
				}
			case len(f) >= 2 && f[0] == "fail":
				p.mu.Lock()
				p.fails++
				if len(p.first) < 5 {
					p.first = append(p.first, sc.Text())
				}
				p.mu.Unlock()
			case len(f) == 2 && f[0] == "pruned":
				n, _ := strconv.ParseInt(f[1], 10, 64)
				p.mu.Lock()
				if p.pruned == 0 {
					close(p.PrunedOnce)
				}
				p.pruned += n
				p.mu.Unlock()
				tr.Timeline.Add(fmt.Sprintf("node %s pruned %d rows", name, n))
			case len(f) == 1 && f[0] == "stopped":
				close(p.Stopped)
			case extra != nil && extra(f):
			default:
				tr.Fail("%s: unexpected line %q", name, sc.Text())
			}
		}
	}, env...)
	return p
}

// Pruned returns the rows the node's prunes deleted.
func (p *Proc) Pruned() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pruned
}

// Acks returns how many publishes returned an event.
func (p *Proc) Acks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acks
}

// Fails returns how many publishes failed (Node.Outages).
func (p *Proc) Fails() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fails
}

// FirstFails returns the node's first five "fail" lines: what the
// publishes that failed returned.
func (p *Proc) FirstFails() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.first)
}

// WaitAcks waits, at most within, until the node has acknowledged n
// publishes; it reports whether it has.
func (p *Proc) WaitAcks(n int, within time.Duration) bool {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for p.Acks() < n {
		select {
		case <-p.ackC:
		case <-timer.C:
			return p.Acks() >= n
		}
	}
	return true
}

// Stop tells the node to stop publishing and waits, at most within, until
// it has; it reports whether it did.
func (p *Proc) Stop(within time.Duration) bool {
	io.WriteString(p.Stdin, "stop\n")
	select {
	case <-p.Stopped:
		return true
	case <-time.After(within):
		return false
	}
}
