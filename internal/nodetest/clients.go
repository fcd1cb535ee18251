package nodetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Spec is a Client to start: its scope and transport, whether it joins
// from cursor 0 (once the first prune deleted rows: a pruned gap, then
// the retained events) and whether it stays on node 1 until its stream
// ends.
type Spec struct {
	Scope            []string
	Mode             Mode
	FromZero, Sticky bool
}

// Specs are sixteen clients: every scope shape, on every node, over SSE,
// over polls, and switching transports on one cursor; two stay on node 1
// until it dies, four join from cursor 0 after the first prune, the
// others from the head.
var Specs = []Spec{
	{nil, OverSSE, false, false}, {[]string{"a"}, OverSSE, false, true}, {[]string{"a", "b"}, OverSSE, true, false},
	{[]string{"c"}, OverSSE, false, false}, {nil, OverSSE, false, true}, {[]string{"b"}, OverSSE, false, false},
	{[]string{"a"}, OverSSE, false, false}, {nil, OverSSE, true, false},
	{nil, OverPoll, false, false}, {[]string{"a"}, OverPoll, false, false}, {[]string{"b", "c"}, OverPoll, false, false},
	{nil, OverPoll, true, false}, {[]string{"c"}, OverPoll, false, true},
	{[]string{"a"}, OverBoth, false, false}, {nil, OverBoth, false, false}, {[]string{"b"}, OverBoth, true, false},
}

// StartClients starts a Client per spec, client i on node i%3 (a sticky
// one on node 1), each with a random source of tr.Seed and i, until ctx
// ends or stop (which waits for them; it may be called more than once).
// A client joining from cursor 0 waits for prunedOnce first (nil: it does
// not wait). The clients take the store's outages as cl does.
func StartClients(ctx context.Context, tr *Truth, cl *Cluster, specs []Spec, prunedOnce <-chan struct{}) (clients []*Client, stop func()) {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	clients = make([]*Client, len(specs))
	for i, sp := range specs {
		c := &Client{Name: fmt.Sprintf("client%d%s%v", i, sp.Mode, sp.Scope), Scope: sp.Scope, Mode: sp.Mode, Node: i % 3,
			FromZero: sp.FromZero, Sticky: sp.Sticky, Outages: cl.Outages}
		if c.Sticky {
			c.Node = 1
		}
		clients[i] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.FromZero && prunedOnce != nil {
				select {
				case <-prunedOnce:
				case <-cctx.Done():
					return
				}
			}
			c.Run(cctx, cl, tr, rand.New(rand.NewPCG(tr.Seed, uint64(i))))
		}()
	}
	return clients, func() { cancel(); wg.Wait() }
}

// CatchUp waits, at most within in all, until every client holds the
// newest event of its scope that tr knows committed; it fails t if one
// does not.
func CatchUp(t *testing.T, ctx context.Context, tr *Truth, clients []*Client, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, c := range clients {
		target := tr.Last(c.Scope)
		for c.CursorNow() < target {
			if time.Now().After(deadline) {
				t.Fatalf("%s reached %d, not %d, within %v (failures: %v)", c.Name, c.CursorNow(), target, within, tr.Errors())
			}
			SleepCtx(ctx, 20*time.Millisecond)
		}
	}
}
