package nodetest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/replayd/replayd"
)

// Topics are the topics a Node's publishers cycle through ("" is a
// broadcast, the global topic).
var Topics = []string{"a", "b", "c", ""}

// Mux is what a node serves: hub's SSE endpoint at / and its poll
// endpoint at /poll, where a Client looks for them.
func Mux(hub *replayd.EventHub) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/poll", hub.PollHandler())
	mux.Handle("/", hub.Handler())
	return mux
}

// Serve serves hub for a child process (Mux) on a new listener of
// 127.0.0.1. It returns say,
// which writes a line to the parent on stdout (and exits 4 once the
// parent is gone), having said "addr http://<the listener>".
func Serve(hub *replayd.EventHub) (say func(format string, args ...any), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go http.Serve(ln, Mux(hub))
	var outMu sync.Mutex
	say = func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		if _, err := fmt.Printf(format+"\n", args...); err != nil {
			os.Exit(4) // the parent is gone
		}
	}
	say("addr http://%s", ln.Addr())
	return say, nil
}

// Die ends a child process: err on stderr (which the parent shows when
// the node fails), exit status code.
func Die(code int, err error) {
	fmt.Fprintln(os.Stderr, "node:", err)
	os.Exit(code)
}

// Node is the child side of a node process: a hub (tailing, the test
// opened it on its store) served by Serve, publishers and a pruner.
type Node struct {
	Hub  *replayd.EventHub
	Say  func(format string, args ...any) // from Serve
	Name string                           // the prefix of its event ids
	// Keep, if not 0, prunes the log to its newest Keep events every
	// 200 ms.
	Keep int64
	// Outages: the store may be down. A publish that fails is reported
	// ("fail <id> after <how long>: <error>", the event stays an attempt) and its publisher
	// goes on after a pause; a prune that fails is retried at the next
	// tick. Without Outages either ends the node (exit 3).
	Outages bool
	// Workers are more publishers (replaydpg's transactional one): each
	// runs on a goroutine of its own until quit is closed.
	Workers []func(quit <-chan struct{})
}

// Run runs the node: two publishers, each one event every 8 ms (their
// topics cycling through Topics, event ids "<Name>-w<publisher>-<n>"),
// the pruner if Keep is set and the Workers. It says "try <event as
// JSON>" before each publish and "ack <event as JSON>" with what Publish
// returned, "pruned <n>" per prune that deleted rows, and "stopped" once
// it has stopped publishing after reading "stop" on stdin. It exits when
// stdin ends; it never returns.
func (n Node) Run() {
	ctx := context.Background()
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(8 * time.Millisecond)
			defer tick.Stop()
			for k := 0; ; k++ {
				select {
				case <-quit:
					return
				case <-tick.C:
				}
				topic := Topics[(k+w)%len(Topics)]
				id := fmt.Sprintf("%s-w%d-%d", n.Name, w, k)
				payload, _ := json.Marshal(map[string]string{"id": id, "topic": topic})
				try, _ := json.Marshal(replayd.Event{EventID: id, Type: "message", Topic: topic, Payload: payload})
				n.Say("try %s", try)
				began := time.Now()
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				ev, err := n.Hub.Publish(pctx, topic, json.RawMessage(payload), replayd.WithEventID(id))
				cancel()
				if err != nil {
					if !n.Outages {
						Die(3, err)
					}
					n.Say("fail %s after %v: %v", id, time.Since(began).Round(time.Millisecond), err)
					select {
					case <-quit:
						return
					case <-time.After(20 * time.Millisecond): // a publisher's back-off while its store is down
					}
					continue
				}
				ack, _ := json.Marshal(ev)
				n.Say("ack %s", ack)
			}
		}()
	}
	for _, w := range n.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w(quit)
		}()
	}
	if n.Keep > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-quit:
					return
				case <-tick.C:
				}
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				deleted, err := n.Hub.Prune(pctx, replayd.RetentionPolicy{MaxEvents: n.Keep})
				cancel()
				if err != nil && !n.Outages {
					Die(3, err)
				}
				if deleted > 0 {
					n.Say("pruned %d", deleted)
				}
			}
		}()
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "stop" {
			close(quit)
			wg.Wait()
			n.Say("stopped")
		}
	}
	os.Exit(0) // the parent is done (or gone): no graceful close needed
}
