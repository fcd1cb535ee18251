// Command cluster runs two replayd nodes on one PostgreSQL log and a client
// that bounces between them: it streams live from node A, drops, and while
// it is away events are published on both nodes; it reconnects to node B
// with its Last-Event-ID and is replayed exactly what it missed, then goes
// live again; then the same back to node A. Every frame it prints is what
// went over the wire.
//
// Run it with a PostgreSQL DSN in REPLAYD_PG_DSN:
//
//	REPLAYD_PG_DSN=postgres://user:pass@localhost:5432/db go run .
//
// from this directory (it is a module of its own, for pgx). With no
// PostgreSQL at hand, as root on Debian, .ci/pg.sh starts a throwaway one:
//
//	bash -c 'source ../../.ci/pg.sh && go run .'
//
// Each node is what one application instance behind a load balancer runs:
// a replaydpg.Store, a hub on it (replayd.NewWithStore), StartTail to
// deliver the other nodes' events (woken by LISTEN/NOTIFY; the interval is
// only the fallback poll) and the SSE handler. Here both nodes live in one
// process for a one-command demo; each has its own connection pool and
// listener connection, exactly as separate processes would. The demo
// serves on 127.0.0.1 only, works under a fresh table prefix, drops its
// tables at exit, and exits by itself within a few seconds.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydpg"
)

const (
	topic     = "room-1"
	every     = 100 * time.Millisecond // one publish, alternately on A and B
	liveCount = 4                      // live events the client reads on each visit
	awayCount = 3                      // events published while it is away
)

func main() {
	dsn := os.Getenv("REPLAYD_PG_DSN")
	if dsn == "" {
		fmt.Fprintln(os.Stderr, "cluster: set REPLAYD_PG_DSN to a PostgreSQL DSN (see the top of main.go)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, dsn, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

// result is what the demo published and what its client received.
type result struct {
	published []int64 // sequences, in publish order
	received  []int64 // sequences of the event frames the client read
	replayed  []int   // events replayed on each connection
}

// run starts two nodes on one log under a fresh table prefix, publishes
// on both, bounces a client between them, and drops the tables at the end.
func run(ctx context.Context, dsn string, w io.Writer) (res result, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var b [4]byte
	rand.Read(b[:])
	prefix := "cluster_" + hex.EncodeToString(b[:]) + "_"
	defer func() {
		if derr := dropTables(dsn, prefix); err == nil {
			err = derr
		}
	}()
	nodeA, err := startNode(ctx, dsn, prefix, "A")
	if err != nil {
		return res, err
	}
	defer nodeA.close()
	nodeB, err := startNode(ctx, dsn, prefix, "B")
	if err != nil {
		return res, err
	}
	defer nodeB.close()
	fmt.Fprintf(w, "node A on %s, node B on %s: one log, tables %s*\n", nodeA.url, nodeB.url, prefix)

	pub := &publisher{nodes: []*node{nodeA, nodeB}, tick: make(chan struct{}, 1)}
	defer pub.stop()
	c := &client{w: w}
	for i, n := range []*node{nodeA, nodeB, nodeA} {
		if err := c.connect(ctx, n); err != nil {
			return res, err
		}
		if i == 0 {
			// Publish from the moment the client has joined: everything
			// published is then in its scope and above its first cursor.
			pub.start(ctx)
		}
		replayed, err := c.read(liveCount)
		c.close()
		if err != nil {
			return res, fmt.Errorf("node %s: %w", n.name, err)
		}
		res.replayed = append(res.replayed, replayed)
		if i == 2 {
			break
		}
		fmt.Fprintf(w, "client drops at id %d; %d events are published on both nodes while it is away\n", c.cursor, awayCount)
		if err := pub.waitAbove(ctx, c.cursor, awayCount); err != nil {
			return res, err
		}
	}
	pub.stop()
	res.published = pub.seqs()
	res.received = c.received
	fmt.Fprintf(w, "done: the client read %d events over 3 connections on 2 nodes, each once, in order\n", len(c.received))
	return res, nil
}

// node is one application instance: a store, a hub tailing the log, and
// the SSE handler on a port of 127.0.0.1.
type node struct {
	name     string
	url      string
	store    *replaydpg.Store
	hub      *replayd.EventHub
	stopTail func()
	srv      *http.Server
}

func startNode(ctx context.Context, dsn, prefix, name string) (*node, error) {
	store, err := replaydpg.Open(ctx, dsn, replaydpg.WithTablePrefix(prefix))
	if err != nil {
		return nil, err
	}
	hub, err := replayd.NewWithStore(store, replayd.Options{})
	if err != nil {
		store.Close()
		return nil, err
	}
	// Events published on the other node arrive through the tail, woken
	// by NOTIFY; a lost notification costs at most this interval.
	stopTail, err := hub.StartTail(time.Second, replayd.TailOptions{})
	if err != nil {
		hub.Close()
		store.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stopTail()
		hub.Close()
		store.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/events", hub.Handler())
	n := &node{name: name, url: "http://" + ln.Addr().String(), store: store, hub: hub, stopTail: stopTail, srv: &http.Server{Handler: mux}}
	go n.srv.Serve(ln)
	return n, nil
}

// close stops the node: the hub first (it ends its streams), then the
// server, then the store (the hub never closes a store it was given).
func (n *node) close() {
	n.stopTail()
	n.hub.Close()
	n.srv.Close()
	n.store.Close()
}

// dropTables removes the demo's tables.
func dropTables(dsn, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, t := range []string{"events", "head", "watermarks"} {
		if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+prefix+t); err != nil {
			return err
		}
	}
	return nil
}

// publisher publishes on the nodes in turn, every 100 ms.
type publisher struct {
	nodes []*node
	tick  chan struct{} // a send (dropped when full) after each publish

	mu   sync.Mutex
	done []int64
	err  error
	quit chan struct{}
	wg   sync.WaitGroup
}

func (p *publisher) start(ctx context.Context) {
	p.quit = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-p.quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n := p.nodes[i%len(p.nodes)]
			ev, err := n.hub.Publish(ctx, topic, map[string]any{"n": i + 1, "publishedOn": n.name})
			p.mu.Lock()
			if err != nil {
				p.err = err
			} else {
				p.done = append(p.done, ev.Sequence)
			}
			p.mu.Unlock()
			select {
			case p.tick <- struct{}{}:
			default:
			}
			if err != nil {
				return
			}
		}
	}()
}

// stop ends the publishing loop and waits for it; safe to call twice.
func (p *publisher) stop() {
	if p.quit == nil {
		return
	}
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	p.wg.Wait()
}

func (p *publisher) seqs() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.done...)
}

// waitAbove waits until n events above sequence after have been published.
// It counts sequences, not publishes: a client may read an event before
// the Publish that wrote it has returned.
func (p *publisher) waitAbove(ctx context.Context, after int64, n int) error {
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		p.mu.Lock()
		done := 0
		for _, seq := range p.done {
			if seq > after {
				done++
			}
		}
		err := p.err
		p.mu.Unlock()
		if err != nil {
			return err
		}
		if done >= n {
			return nil
		}
		select {
		case <-p.tick:
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			return errors.New("publishing stalled")
		}
	}
}

// client is an SSE client that keeps its cursor across connections, as an
// EventSource does with Last-Event-ID.
type client struct {
	w        io.Writer
	cursor   int64 // the last id read (the hello's, then each event's)
	joined   bool
	received []int64

	resp   *http.Response
	cancel context.CancelFunc
	frames *bufio.Scanner
	head   int64 // the head the current connection's hello reported
}

// connect connects to n (with the cursor, after the first connection)
// and reads and prints the hello.
func (c *client) connect(ctx context.Context, n *node) error {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, n.url+"/events?topic="+topic, nil)
	if err != nil {
		cancel()
		return err
	}
	how := "fresh, from the head"
	if c.joined {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(c.cursor, 10))
		how = "Last-Event-ID: " + strconv.FormatInt(c.cursor, 10)
	}
	fmt.Fprintf(c.w, "\nclient -> node %s (%s)\n", n.name, how)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return err
	}
	c.resp, c.cancel = resp, cancel
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node %s: status %d", n.name, resp.StatusCode)
	}
	c.frames = bufio.NewScanner(resp.Body)
	c.frames.Buffer(make([]byte, 64<<10), 1<<20)
	f, err := c.next()
	if err != nil {
		return err
	}
	var hello struct{ Cursor, Head int64 }
	if f.event != "hello" || json.Unmarshal([]byte(f.data), &hello) != nil {
		return fmt.Errorf("node %s: first frame %+v, want hello", n.name, f)
	}
	if c.joined && hello.Cursor != c.cursor {
		return fmt.Errorf("node %s resumed at %d, not at the cursor %d", n.name, hello.Cursor, c.cursor)
	}
	fmt.Fprintf(c.w, "  hello   cursor=%d head=%d\n", hello.Cursor, hello.Head)
	c.joined, c.cursor, c.head = true, hello.Cursor, hello.Head
	return nil
}

// read prints frames until it has printed live live events (those above
// the hello's head), and returns how many replayed ones came first.
func (c *client) read(live int) (replayed int, err error) {
	for live > 0 {
		f, err := c.next()
		if err != nil {
			return replayed, err
		}
		switch f.event {
		case "heartbeat":
			continue
		case "gap":
			return replayed, fmt.Errorf("unexpected gap %s", f.data)
		}
		seq, err := strconv.ParseInt(f.id, 10, 64)
		if err != nil || seq <= c.cursor {
			return replayed, fmt.Errorf("event id %q after cursor %d", f.id, c.cursor)
		}
		kind := "live"
		if seq <= c.head {
			kind = "replay"
			replayed++
		} else {
			live--
		}
		fmt.Fprintf(c.w, "  %-7s id=%d %s %s\n", kind, seq, f.event, f.data)
		c.cursor = seq
		c.received = append(c.received, seq)
	}
	return replayed, nil
}

// close drops the current connection.
func (c *client) close() {
	if c.resp != nil {
		c.cancel()
		c.resp.Body.Close()
		c.resp = nil
	}
}

// frame is one SSE frame.
type frame struct{ id, event, data string }

// next reads the next frame (comments skipped; a frame ends at a blank
// line).
func (c *client) next() (frame, error) {
	var f frame
	var data []string
	for c.frames.Scan() {
		line := c.frames.Text()
		if line == "" {
			if f.event != "" || len(data) > 0 {
				f.data = strings.Join(data, "\n")
				return f, nil
			}
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			f.id = value
		case "event":
			f.event = value
		case "data":
			data = append(data, value)
		}
	}
	if err := c.frames.Err(); err != nil {
		return f, err
	}
	return f, io.ErrUnexpectedEOF
}
