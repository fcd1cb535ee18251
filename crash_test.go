package replayd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/childproc"
)

// Crash durability: a child OS process publishes in a loop and prints the
// sequence of every publish that returned; the parent kills it with SIGKILL
// at a random moment and reopens the file. Every acknowledged event must be
// there, intact; no row may be torn; the sequence must continue upward.

const (
	crashChildEnv = "REPLAYD_CRASH_CHILD" // the database path: run as the child
	crashRoundEnv = "REPLAYD_CRASH_ROUND"
	crashRounds   = 5
)

// TestCrashDurability runs five rounds of publish, SIGKILL, reopen, check.
func TestCrashDurability(t *testing.T) {
	if path := os.Getenv(crashChildEnv); path != "" {
		crashChild(path, os.Getenv(crashRoundEnv))
		os.Exit(0)
	}
	rng := rand.New(rand.NewPCG(chaosSeed(t), 0)) // the kill moments

	path := filepath.Join(t.TempDir(), "crash.db")

	var totalAcked, totalUnacked int
	for round := 1; round <= crashRounds; round++ {
		child := crashStart(t, "TestCrashDurability", crashChildEnv+"="+path, crashRoundEnv+"="+strconv.Itoa(round))

		// Wait for the first acknowledgement, then kill at a random moment
		// while the child is committing as fast as it can.
		acked := map[int64]string{}
		first, ok := child.nextAck(60 * time.Second)
		if !ok {
			child.kill()
			t.Fatalf("round %d: child acknowledged nothing: %s", round, child.stderr())
		}
		acked[first.seq] = first.eventID
		delay := time.Duration(20+rng.IntN(600)) * time.Millisecond
		deadline := time.NewTimer(delay)
	reading:
		for {
			select {
			case a, ok := <-child.acks:
				if !ok {
					break reading
				}
				acked[a.seq] = a.eventID
			case <-deadline.C:
				break reading
			}
		}
		child.kill()
		// Acknowledgements the child printed before it died are still in
		// the pipe.
		for a := range child.acks {
			acked[a.seq] = a.eventID
		}
		state := child.wait()
		if state.Exited() {
			t.Fatalf("round %d: the child exited by itself (%v) instead of being killed: %s", round, state, child.stderr())
		}

		unacked := crashVerify(t, path, round, acked)
		t.Logf("round %d: killed after %v; %d acknowledged events present and intact, %d more committed but unacknowledged",
			round, delay, len(acked), unacked)
		totalAcked += len(acked)
		totalUnacked += unacked
	}
	t.Logf("%d rounds: %d acknowledged events verified, %d committed-but-unacknowledged rows intact", crashRounds, totalAcked, totalUnacked)
}

// crashVerify reopens the file after a crash and checks it: integrity,
// every acknowledged event present and intact, every row well formed,
// sequences contiguous up to the head, and a new publish continuing
// upward. It returns how many rows were committed without an
// acknowledgement (the child died between commit and print).
func crashVerify(t *testing.T, path string, round int, acked map[int64]string) (unacked int) {
	t.Helper()
	ctx := context.Background()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatalf("round %d: reopen: %v", round, err)
	}
	defer db.Close()

	var integrity string
	if err := db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&integrity); err != nil || integrity != "ok" {
		t.Fatalf("round %d: integrity_check = %q, %v", round, integrity, err)
	}

	rows := crashReadRows(t, db)
	bySeq := make(map[int64]Event, len(rows))
	var prev int64
	// Every open raises the sequence floor, so sequences jump between
	// rounds; the ordinals number every row 1, 2, 3, ...
	ords := crashReadOrdinals(t, db)
	for i, ev := range rows {
		if ev.Sequence <= prev || ords[i] != int64(i)+1 {
			t.Errorf("round %d: sequence %d (ordinal %d) follows %d (row %d): a committed row is missing", round, ev.Sequence, ords[i], prev, i)
		}
		prev = ev.Sequence
		bySeq[ev.Sequence] = ev
		if err := crashCheckRow(ev); err != nil {
			t.Errorf("round %d: torn or foreign row %d: %v", round, ev.Sequence, err)
		}
	}
	for seq, id := range acked {
		ev, ok := bySeq[seq]
		switch {
		case !ok:
			t.Errorf("round %d: acknowledged event %d (%s) is missing after the crash", round, seq, id)
		case ev.EventID != id:
			t.Errorf("round %d: row %d holds event %s, acknowledged as %s", round, seq, ev.EventID, id)
		}
	}
	prefix := fmt.Sprintf("crash-r%d-", round)
	for _, ev := range rows {
		if _, ok := acked[ev.Sequence]; !ok && strings.HasPrefix(ev.EventID, prefix) {
			unacked++
		}
	}

	var head int64
	if err := db.QueryRowContext(ctx, `SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0)`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	if head != prev {
		t.Errorf("round %d: head %d, newest row %d", round, head, prev)
	}
	h, err := New(db, Options{})
	if err != nil {
		t.Fatalf("round %d: new hub after crash: %v", round, err)
	}
	defer h.Close()
	if head, err = h.LatestSequence(ctx); err != nil || head < prev {
		t.Fatalf("round %d: head %d once reopened, %v; below the newest row %d", round, head, err, prev)
	}
	id := fmt.Sprintf("parent-r%d", round)
	ev, err := h.Publish(ctx, crashTopic(id), crashPayload(id), WithEventID(id), WithType("crash"))
	if err != nil {
		t.Fatalf("round %d: publish after crash: %v", round, err)
	}
	if ev.Sequence != head+1 {
		t.Errorf("round %d: the first publish after the crash got sequence %d, want %d", round, ev.Sequence, head+1)
	}
	if t.Failed() {
		t.FailNow()
	}
	return unacked
}

func crashReadRows(t *testing.T, db *sql.DB) []Event {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT sequence, event_id, type, coalesce(topic, ''), payload, created_at FROM events ORDER BY sequence`)
	if err != nil {
		t.Fatalf("read rows: %v", err)
	}
	defer rows.Close()
	var evs []Event
	for rows.Next() {
		var (
			ev      Event
			payload string
			created int64
		)
		if err := rows.Scan(&ev.Sequence, &ev.EventID, &ev.Type, &ev.Topic, &payload, &created); err != nil {
			t.Fatalf("read rows: %v", err)
		}
		ev.Payload, ev.CreatedAt = json.RawMessage(payload), time.UnixMilli(created)
		evs = append(evs, ev)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read rows: %v", err)
	}
	return evs
}

// crashReadOrdinals returns the ordinals of the rows, in sequence order.
func crashReadOrdinals(t *testing.T, db *sql.DB) []int64 {
	t.Helper()
	rs, err := db.QueryContext(context.Background(), `SELECT ordinal FROM events ORDER BY sequence`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []int64
	for rs.Next() {
		var o int64
		if err := rs.Scan(&o); err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// crashCheckRow checks that a row is exactly what its writer published.
func crashCheckRow(ev Event) error {
	if ev.Type != "crash" {
		return fmt.Errorf("type %q", ev.Type)
	}
	if want := crashTopic(ev.EventID); ev.Topic != want {
		return fmt.Errorf("topic %q, want %q", ev.Topic, want)
	}
	if want := crashPayload(ev.EventID); string(ev.Payload) != string(want) {
		return fmt.Errorf("payload of %d bytes differs from the %d published", len(ev.Payload), len(want))
	}
	return nil
}

// crashPayload is the payload published under event id: a JSON object
// whose size (up to 48 KiB) and content follow from the id, so the parent
// can check rows it never got an acknowledgement for.
func crashPayload(id string) json.RawMessage {
	sum := sha256.Sum256([]byte(id))
	n := int(binary.BigEndian.Uint16(sum[:2])) % (48 << 10)
	pad := make([]byte, n)
	for i := range pad {
		pad[i] = "0123456789abcdef"[sum[i%len(sum)]&15]
	}
	return json.RawMessage(fmt.Sprintf(`{"id":%q,"sum":"%x","pad":"%s"}`, id, sum[:8], pad))
}

// crashTopic is the topic an event id is published on; some are broadcasts.
func crashTopic(id string) string {
	sum := sha256.Sum256([]byte("topic" + id))
	if sum[0]%4 == 0 {
		return ""
	}
	return fmt.Sprintf("t%d", sum[1]%3)
}

// childHub opens the database at path and a hub on it for a child
// process, or exits with status 2.
func childHub(path string) (*EventHub, *sql.DB) {
	db, err := OpenDB(path)
	if err == nil {
		var h *EventHub
		if h, err = New(db, Options{}); err == nil {
			return h, db
		}
	}
	fmt.Fprintln(os.Stderr, "child:", err)
	os.Exit(2)
	return nil, nil
}

// crashChild publishes from several goroutines until it is killed,
// printing "ack <sequence> <event id>" for every publish that returned.
func crashChild(path, round string) {
	h, _ := childHub(path)
	out := crashLineWriter{w: os.Stdout}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The parent kills long before this; the bound only keeps an
			// orphan from running forever.
			for n := 0; n < 1_000_000; n++ {
				id := fmt.Sprintf("crash-r%s-w%d-%d", round, w, n)
				ev, err := h.Publish(context.Background(), crashTopic(id), crashPayload(id), WithEventID(id), WithType("crash"))
				if err != nil {
					fmt.Fprintln(os.Stderr, "publish:", err)
					os.Exit(3)
				}
				out.printf("ack %d %s\n", ev.Sequence, ev.EventID)
			}
		}()
	}
	wg.Wait()
}

// crashLineWriter writes whole lines, each with one write call.
type crashLineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *crashLineWriter) printf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := fmt.Fprintf(c.w, format, args...); err != nil {
		os.Exit(4) // the parent is gone
	}
}

// crashAck is one "ack <sequence> <event id>" line of a child.
type crashAck struct {
	seq     int64
	eventID string
}

// crashProc is a child test process (see internal/childproc) whose
// stdout lines are acknowledgements ("ack <sequence> <event id>") or other
// lines.
type crashProc struct {
	*childproc.Proc
	stdin io.WriteCloser
	acks  chan crashAck // closed at the child's stdout EOF
	lines chan string   // every other stdout line; closed at EOF
}

// crashStart re-executes the test binary running only the test named, with
// env added: the test function sees the env and runs as the child. Its
// stdout lines arrive on acks if they are acknowledgements, else on lines.
func crashStart(t *testing.T, test string, env ...string) *crashProc {
	t.Helper()
	p := &crashProc{acks: make(chan crashAck, 1024), lines: make(chan string, 64)}
	p.Proc = childproc.Start(t, test, func(stdout io.Reader) {
		defer close(p.acks)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			var a crashAck
			if _, err := fmt.Sscanf(line, "ack %d %s", &a.seq, &a.eventID); err == nil {
				p.acks <- a
			} else {
				p.lines <- line
			}
		}
	}, env...)
	p.stdin = p.Stdin
	// Registered after childproc's cleanup, so it runs first: it drains
	// what the test has not read, so the reader reaches EOF.
	t.Cleanup(func() {
		p.kill()
		p.wait()
	})
	return p
}

// nextAck returns the next acknowledgement, or false if stdout ends or
// nothing comes within d.
func (p *crashProc) nextAck(d time.Duration) (crashAck, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case a, ok := <-p.acks:
		return a, ok
	case <-timer.C:
		return crashAck{}, false
	}
}

// kill sends SIGKILL (Process.Kill on Unix).
func (p *crashProc) kill() { p.Kill() }

// wait drains what the test has not read of stdout and reaps the child;
// it returns its state.
func (p *crashProc) wait() *os.ProcessState {
	go func() {
		for range p.acks {
		}
	}()
	go func() {
		for range p.lines {
		}
	}()
	return p.Wait()
}

func (p *crashProc) stderr() string { return p.Stderr() }
