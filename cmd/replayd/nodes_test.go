package main_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/chaostest"
	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/replaydpg"
)

// pgPrefix returns the test cluster's DSN (.ci/pg.sh exports it) and a
// fresh table prefix whose tables are dropped at the end of the test. Without
// a cluster the test is skipped, or fails under CI=true.
func pgPrefix(t *testing.T) (dsn, prefix string) {
	t.Helper()
	if dsn = os.Getenv("REPLAYD_PG_DSN"); dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("REPLAYD_PG_DSN is not set under CI: source .ci/pg.sh")
		}
		t.Skip("REPLAYD_PG_DSN is not set; start PostgreSQL with: source .ci/pg.sh")
	}
	var b [6]byte
	rand.Read(b[:])
	prefix = "srv" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, table := range []string{"events", "head", "watermarks", "skips", "outbox", "streams", "stream_producers", "raw"} {
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+prefix+table); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return dsn, prefix
}

// Two serve processes on one PostgreSQL database are nodes of one log.
// Publishers post to either node while clients hop between them with
// their cursor, over SSE and polls by turns; the chaos oracle
// (chaostest.Check) then holds what every client received, visit by
// visit, to what the publishers were acknowledged and to the log: every
// event once, in order, no silent hole, and every resume on the other node
// going on at its cursor. Then node B's SIGTERM ends its streams and
// leaves node A serving.
func TestTwoNodesOnPostgres(t *testing.T) {
	dsn, prefix := pgPrefix(t)
	args := []string{"--postgres", dsn, "--postgres-table-prefix", prefix, "--publish-key", publishKey,
		"--token-key", secretFile(t), "--heartbeat", "1m", "--tail-interval", "200ms"}
	a := start(t, nil, args...)
	b := start(t, nil, args...)
	reader := pgReader(t, dsn, prefix)
	nodes := []*node{
		{daemon: a, srv: &chaostest.Server{Name: "A", ReplayLimit: 100}},
		{daemon: b, srv: &chaostest.Server{Name: "B", ReplayLimit: 100}},
	}
	tok := token(t, farFuture(), "*")
	ledger, tl := chaostest.NewLedger(), chaostest.NewTimeline()

	liveA := wiretest.Dial(t, a.base+"/events?topic=room-1&access_token="+tok, nil)
	liveA.Hello()
	liveB := wiretest.Dial(t, b.base+"/events?topic=room-1&access_token="+tok, nil)
	liveB.Hello()

	// Two publishers, each posting to the nodes by turns.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pubs sync.WaitGroup
	pubErr := make(chan error, 2)
	for p := range 2 {
		pubs.Go(func() {
			for n := range 120 {
				if err := publishTo(nodes[(p+n)%2].base, p, n, ledger); err != nil {
					pubErr <- err
					return
				}
				time.Sleep(5 * time.Millisecond) // spread over the clients' visits
			}
		})
	}
	hoppers := []*hopper{
		{name: "room-1", scope: []string{"room-1"}},
		{name: "rooms", scope: []string{"room-1", "room-2"}},
		{name: "global"},
		{name: "room-2", scope: []string{"room-2"}},
	}
	var clients sync.WaitGroup
	for i, h := range hoppers {
		clients.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(i), 22))
			for visit := 0; ctx.Err() == nil; visit++ {
				n := nodes[(i+visit)%2]
				life := time.Duration(50+rng.IntN(250)) * time.Millisecond
				var err error
				if visit%2 == 0 {
					err = h.sse(ctx, n, tok, ledger, tl, life, 0)
				} else {
					err = h.poll(ctx, n, tok, ledger, tl, life)
				}
				if err != nil && ctx.Err() == nil {
					h.err = err
					return
				}
			}
		})
	}
	pubs.Wait()
	cancel()
	clients.Wait()
	close(pubErr)
	for err := range pubErr {
		t.Fatal(err)
	}
	// Each client comes back once more, on a node of its own, and reads to
	// the newest event of its scope.
	for i, h := range hoppers {
		if h.err != nil {
			t.Fatalf("client %s: %v", h.name, h.err)
		}
		target := ledger.Last(h.scope)
		if err := h.sse(context.Background(), nodes[i%2], tok, ledger, tl, waitFor, target); err != nil {
			t.Fatalf("client %s: %v", h.name, err)
		}
		if c := h.conns[len(h.conns)-1]; !c.Reached(target) {
			t.Fatalf("client %s did not reach event %d within %v on node %s: %s", h.name, target, waitFor, c.Server.Name, c.End)
		}
	}
	for _, s := range []*wiretest.Client{liveA, liveB} {
		s.Close()
	}

	in := chaostest.Input{Ledger: ledger, Timeline: tl, Seed: 22}
	in.Log, in.Mark, in.Head = readLog(t, reader)
	visits, resumes := 0, 0
	for _, h := range hoppers {
		in.Conns = append(in.Conns, h.conns...)
		in.Polls = append(in.Polls, h.polls...)
		visits += len(h.conns) + len(h.polls)
		resumes += h.resumes
	}
	rep := chaostest.Check(in)
	for i, msg := range rep.Violations {
		if i == 8 {
			t.Errorf("... and %d more violations", len(rep.Violations)-i)
			break
		}
		t.Errorf("%s", msg)
	}
	rep.Log(t)
	if rep.Published != 240 {
		t.Errorf("the oracle checked %d events, want the 240 published", rep.Published)
	}
	if rep.Resumes+rep.PollResumes < 8 || rep.ExactResumes+rep.PollExactResumes == 0 {
		t.Errorf("%d visits, %d SSE and %d poll resumes on the other node (%d and %d exact): too few to show anything",
			visits, rep.Resumes, rep.PollResumes, rep.ExactResumes, rep.PollExactResumes)
	}

	// Node B's shutdown leaves node A serving.
	liveA = wiretest.Dial(t, a.base+"/events?topic=room-1&access_token="+tok, nil)
	liveA.Hello()
	liveB = wiretest.Dial(t, b.base+"/events?topic=room-1&access_token="+tok, nil)
	liveB.Hello()
	b.stop(t, syscall.SIGTERM)
	liveB.Ended("node B's stream after SIGTERM")
	next := publish(t, a.base, "room-1", "after-b", 0)
	liveA.NextIs(next.Sequence, "node A after node B stopped")
}

// node is one serve process and what the oracle knows of it.
type node struct {
	*daemon
	srv *chaostest.Server
}

// publishTo posts publisher p's event n to base and records it in the
// ledger: published when acknowledged, attempted (its outcome unknown)
// otherwise. Topics cycle through room-1, room-2 and a broadcast.
func publishTo(base string, p, n int, ledger *chaostest.Ledger) error {
	ev := replayd.Event{EventID: fmt.Sprintf("p%d-%d", p, n), Type: "tick", Topic: []string{"room-1", "room-2", ""}[n%3],
		Payload: json.RawMessage(fmt.Sprintf(`{"p":%d,"n":%d}`, p, n))}
	body, _ := json.Marshal(map[string]any{"topic": ev.Topic, "type": ev.Type, "id": ev.EventID, "data": ev.Payload})
	ledger.Attempted(ev)
	req, err := http.NewRequest(http.MethodPost, base+"/publish", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+publishKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: waitFor}).Do(req)
	if err != nil {
		return fmt.Errorf("publish %s: %v", ev.EventID, err)
	}
	defer resp.Body.Close()
	var ans publishAnswer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("publish %s: %d %+v %v", ev.EventID, resp.StatusCode, ans, err)
	}
	ev.Sequence = ans.Sequence
	ledger.Published(ev)
	return nil
}

// pgReader opens, in this process, a hub on the tables the nodes share,
// for the oracle to read the log through at the end. It opens before
// anything is published: opening raises the log's sequence floor, which
// would move the head past the newest event.
func pgReader(t *testing.T, dsn, prefix string) *replayd.EventHub {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	st, err := replaydpg.Open(ctx, dsn, replaydpg.WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	h, err := replayd.NewWithStore(st, replayd.Options{})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		st.Close()
	})
	return h
}

// readLog reads the log through h: every row, the prune watermark, and
// the head.
func readLog(t *testing.T, h *replayd.EventHub) ([]replayd.Event, int64, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, mark, err := chaostest.ReadLog(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	head, err := h.LatestSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return rows, mark, head
}

// hopper is a client hopping between nodes on one cursor, as an
// EventSource keeps it (the last id received) or a poll's answer gives it,
// recording every visit for the oracle.
type hopper struct {
	name  string
	scope []string // none: global

	cursor  string          // "" until a visit gave one
	last    chaostest.Visit // the visit that gave it
	conns   []*chaostest.Conn
	polls   []*chaostest.PollSession
	resumes int
	err     error // what stopped it
}

func (h *hopper) query() url.Values { return url.Values{"topic": h.scope} }

// sse reads one SSE stream of n for at most life, or until it reaches
// target (0: no target).
func (h *hopper) sse(ctx context.Context, n *node, tok string, ledger *chaostest.Ledger, tl *chaostest.Timeline, life time.Duration, target int64) error {
	ctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	rec := &chaostest.Conn{Server: n.srv, Topics: h.scope, ID: len(h.conns) + len(h.polls), Client: h.name, Mode: "fresh", Via: "header",
		Behaviour: "hop", Start: tl.Since(), Known: ledger.Max(), Sent: h.cursor}
	if h.cursor != "" {
		rec.Mode, rec.After = "resume", h.last
		h.resumes++
	}
	h.conns = append(h.conns, rec)
	defer func() { rec.Stop = tl.Since() }()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.base+"/events?"+h.query().Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if h.cursor != "" {
		req.Header.Set("Last-Event-ID", h.cursor)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		rec.End = "no response: " + err.Error()
		if ctx.Err() != nil {
			return nil // the visit's life ended first
		}
		return err
	}
	defer resp.Body.Close()
	rec.Status, rec.Chunked = resp.StatusCode, slices.Contains(resp.TransferEncoding, "chunked")
	if resp.StatusCode != http.StatusOK {
		rec.End = "status " + resp.Status
		return fmt.Errorf("node %s: %s", n.srv.Name, rec.End)
	}
	frames := make(chan chaostest.Frame, 64)
	perr := make(chan error, 1)
	go func() {
		perr <- chaostest.ReadFrames(resp.Body, frames)
		close(frames)
	}()
	for f := range frames {
		rec.Add(f)
		if f.HasID {
			h.cursor, h.last = f.ID, rec
		}
		if target > 0 && rec.Reached(target) {
			cancel()
		}
	}
	rec.End = fmt.Sprintf("stream ended (%v)", <-perr)
	if ctx.Err() != nil {
		rec.End = "client left"
	}
	return nil
}

// poll polls n for at most life, passing the cursor back each time, as one
// session.
func (h *hopper) poll(ctx context.Context, n *node, tok string, ledger *chaostest.Ledger, tl *chaostest.Timeline, life time.Duration) error {
	s := &chaostest.PollSession{Server: n.srv, Topics: h.scope, ID: len(h.conns) + len(h.polls), Client: h.name, Mode: "fresh", End: "visit over"}
	if h.cursor != "" {
		s.Mode, s.After = "resume", h.last
		h.resumes++
	}
	h.polls = append(h.polls, s)
	for end := time.Now().Add(life); time.Now().Before(end) && ctx.Err() == nil; {
		p := &chaostest.Poll{Sent: h.cursor, Limit: 20, Known: ledger.Max(), Start: tl.Since()}
		q := h.query()
		if h.cursor != "" {
			q.Set("cursor", h.cursor)
			p.Wait = 100 * time.Millisecond
			q.Set("wait", "0.1")
		}
		q.Set("limit", strconv.Itoa(p.Limit))
		s.Polls = append(s.Polls, p)
		status, retryAfter, body, err := get(n.base+"/poll?"+q.Encode(), tok)
		p.Stop = tl.Since()
		if err != nil {
			return fmt.Errorf("poll on node %s: %v", n.srv.Name, err)
		}
		if err := p.Record(status, retryAfter, body); err != nil || !p.OK() {
			return fmt.Errorf("poll on node %s: %d %s %v", n.srv.Name, status, body, err)
		}
		h.cursor, h.last = strconv.FormatInt(p.Cursor(), 10), s
	}
	return nil
}

// get sends a GET with tok, within waitFor, and reads the whole answer.
func get(u, tok string) (status int, retryAfter string, body []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), body, err
}
