package replaydredis

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// Log identity across a failover to a replica that lagged
// (hubtest.CheckRestore, in place): the store reaches Redis through a
// proxy (the address a Sentinel or a load balancer would move); the
// replica, in sync at the 5th event, is cut off there (REPLICAOF NO ONE:
// what it had when the primary went on without it) while the primary goes
// on to the 10th; then the primary dies and the proxy sends every new
// connection to the former replica, under the running hub. Its run_id is
// not the one the log was checked by, so the floor is raised before any
// command.
func TestFailoverToLaggedReplica(t *testing.T) {
	primary := redisserver.Start(t, "--repl-diskless-sync-delay", "0")
	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", primary.Port())
	proxy := newProxy(t, primary.Addr)
	prefix := testPrefix(t)
	hubtest.CheckRestore(t, hubtest.Restore{
		Open: func() *replayd.EventHub { return hubOn(t, openStore(t, "redis://"+proxy.addr(), prefix)) },
		Backup: func(h *replayd.EventHub) *replayd.EventHub {
			if n, err := rawClient(t, primary).Wait(ctxT(t), 1, 10_000).Result(); err != nil || n != 1 {
				t.Fatalf("WAIT for the replica: %d, %v", n, err)
			}
			if err := rawClient(t, replica).ReplicaOf(ctxT(t), "NO", "ONE").Err(); err != nil {
				t.Fatalf("REPLICAOF NO ONE: %v", err)
			}
			return h
		},
		Restore: func(h *replayd.EventHub) *replayd.EventHub {
			primary.Kill()
			proxy.switchTo(replica.Addr)
			return h
		},
	})
}

// proxy forwards TCP connections to a backend address that can be
// switched; switching closes the connections to the old one.
type proxy struct {
	t  testing.TB
	l  net.Listener
	mu sync.Mutex
	to string
	cs []net.Conn
	wg sync.WaitGroup
}

func newProxy(t testing.TB, to string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, l: l, to: to}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		l.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) switchTo(to string) {
	p.mu.Lock()
	p.to = to
	p.mu.Unlock()
	p.closeAll()
}

func (p *proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.cs {
		c.Close()
	}
	p.cs = nil
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.t.Errorf("proxy: %v", err)
			}
			return
		}
		p.mu.Lock()
		to := p.to
		p.mu.Unlock()
		b, err := net.Dial("tcp", to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.cs = append(p.cs, c, b)
		p.mu.Unlock()
		for _, pair := range [][2]net.Conn{{c, b}, {b, c}} {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				io.Copy(pair[0], pair[1])
				pair[0].Close()
				pair[1].Close()
			}()
		}
	}
}
