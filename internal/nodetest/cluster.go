package nodetest

import (
	"fmt"
	"sync"

	"github.com/replayd/replayd/chaostest"
)

// Cluster is the three nodes' current addresses ("" while one is down)
// and what the oracle knows of each. Set Limit and Outages before the
// first SetAddr.
type Cluster struct {
	Limit   int  // the nodes' ReplayLimit
	Outages bool // the store may be down: a node may answer 503

	mu      sync.Mutex
	addrs   [3]string
	gens    [3]int
	servers [3]*chaostest.Server
}

// SetAddr records node i's address for its generation gen (1, then one
// more per restart); "" while it is down.
func (cl *Cluster) SetAddr(i int, addr string, gen int) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.addrs[i], cl.gens[i] = addr, gen
	cl.servers[i] = &chaostest.Server{Name: fmt.Sprintf("n%dg%d", i, gen), ReplayLimit: cl.Limit, Unavailable: cl.Outages}
}

// Addr returns node i's address, generation and oracle record.
func (cl *Cluster) Addr(i int) (string, int, *chaostest.Server) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.addrs[i], cl.gens[i], cl.servers[i]
}
