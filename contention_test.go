package replayd

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// Several OS processes on one database file: three publishers at once, and
// one process publishing while another tails and serves SSE.

const (
	contentionChildEnv = "REPLAYD_CONTENTION_CHILD" // the database path: run as a publisher child
	contentionIndexEnv = "REPLAYD_CONTENTION_INDEX"
	contentionProcs    = 3
	contentionDuration = 3 * time.Second

	tailChildEnv   = "REPLAYD_TAIL_CHILD" // the database path: run as the tail test's publisher
	tailChildCount = 400
)

// TestContentionThreeProcesses runs three OS processes publishing to one
// file at once, each from several goroutines. The database is busy all the
// time; busy must be retried within the busy timeout, so no publish may
// return an error; every acknowledged row must be present exactly once, and
// no row may be present that was not acknowledged.
func TestContentionThreeProcesses(t *testing.T) {
	if path := os.Getenv(contentionChildEnv); path != "" {
		contentionChild(path, os.Getenv(contentionIndexEnv))
		os.Exit(0)
	}
	path := filepath.Join(t.TempDir(), "contention.db")
	// The children create the schema themselves, all at once.
	procs := make([]*crashProc, contentionProcs)
	for i := range procs {
		procs[i] = crashStart(t, "TestContentionThreeProcesses",
			contentionChildEnv+"="+path, contentionIndexEnv+"="+strconv.Itoa(i))
	}
	for i, p := range procs {
		if line := contentionLine(t, p, 60*time.Second); line != "ready" {
			t.Fatalf("child %d: %q instead of ready: %s", i, line, p.stderr())
		}
	}
	start := time.Now()
	for _, p := range procs {
		if _, err := fmt.Fprintln(p.stdin, "go"); err != nil {
			t.Fatal(err)
		}
	}

	// Collect acknowledgements while they publish; closing stdin stops them.
	acks := make([][]crashAck, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range p.acks {
				acks[i] = append(acks[i], a)
			}
		}()
	}
	stop := time.NewTimer(contentionDuration)
	<-stop.C
	for _, p := range procs {
		p.stdin.Close()
	}
	for i, p := range procs {
		if line := contentionLine(t, p, 60*time.Second); !strings.HasPrefix(line, "done ") {
			t.Errorf("child %d: %q instead of done: %s", i, line, p.stderr())
		}
	}
	wg.Wait()
	for i, p := range procs {
		if state := p.wait(); !state.Success() {
			t.Errorf("child %d: %v: %s", i, state, p.stderr())
		}
	}
	elapsed := time.Since(start)
	if t.Failed() {
		t.FailNow()
	}

	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows := crashReadRows(t, db)
	byID := make(map[string]Event, len(rows))
	for _, ev := range rows {
		byID[ev.EventID] = ev
	}
	seen := map[int64]string{}
	total := 0
	for i, as := range acks {
		if len(as) == 0 {
			t.Errorf("child %d published nothing", i)
		}
		total += len(as)
		for _, a := range as {
			if other, dup := seen[a.seq]; dup {
				t.Errorf("sequence %d acknowledged twice: %s and %s", a.seq, other, a.eventID)
			}
			seen[a.seq] = a.eventID
			ev, ok := byID[a.eventID]
			switch {
			case !ok:
				t.Errorf("acknowledged event %s (sequence %d) is missing", a.eventID, a.seq)
			case ev.Sequence != a.seq:
				t.Errorf("event %s stored as %d, acknowledged as %d", a.eventID, ev.Sequence, a.seq)
			case ev.Topic != crashTopic(a.eventID) || ev.Type != "crash" || string(ev.Payload) != string(contentionPayload(a.eventID)):
				t.Errorf("row %d differs from what was published: %+v", ev.Sequence, ev)
			}
		}
	}
	if len(rows) != total {
		t.Errorf("%d rows stored, %d publishes acknowledged", len(rows), total)
	}
	t.Logf("%d processes published %d events (%v) in %v: %.0f/s, every one stored once",
		contentionProcs, total, []int{len(acks[0]), len(acks[1]), len(acks[2])}, elapsed.Round(time.Millisecond),
		float64(total)/elapsed.Seconds())
}

// contentionPayload is a small payload that follows from the event id.
func contentionPayload(id string) []byte { return fmt.Appendf(nil, `{"id":%q}`, id) }

// contentionLine returns the child's next stdout line that is not an
// acknowledgement, or fails the test.
func contentionLine(t *testing.T, p *crashProc, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case line, ok := <-p.lines:
		if !ok {
			t.Fatalf("child ended: %s", p.stderr())
		}
		return line
	case <-timer.C:
		t.Fatalf("child said nothing within %v: %s", d, p.stderr())
	}
	return ""
}

// contentionChild opens the file, says "ready", waits for "go" on stdin,
// then publishes from four goroutines until stdin closes, printing an
// acknowledgement per publish and "done <n>" at the end. Any publish error
// is printed to stderr and fails the child.
func contentionChild(path, index string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child", index+":", err)
		os.Exit(2)
	}
	h, db := childHub(path)
	out := crashLineWriter{w: os.Stdout}
	out.printf("ready\n")
	in := bufio.NewReader(os.Stdin)
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		fail(fmt.Errorf("want go, got %q, %v", line, err))
	}
	stop := make(chan struct{})
	go func() {
		in.ReadString('\n') // EOF when the parent closes stdin
		close(stop)
	}()
	safety := time.AfterFunc(2*time.Minute, func() { close(stop) })
	defer safety.Stop()
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("p%s-w%d-%d", index, w, i)
				ev, err := h.Publish(context.Background(), crashTopic(id), contentionPayload(id), WithEventID(id), WithType("crash"))
				if err != nil {
					fail(fmt.Errorf("publish %s: %w", id, err))
				}
				n.Add(1)
				out.printf("ack %d %s\n", ev.Sequence, ev.EventID)
			}
		}()
	}
	wg.Wait()
	if err := h.Close(); err != nil {
		fail(err)
	}
	if err := db.Close(); err != nil {
		fail(err)
	}
	out.printf("done %d\n", n.Load())
}

// TestContentionTailAcrossProcesses runs a real second OS process that
// publishes while a hub in this process tails the file, publishes too, and
// serves SSE. A global client and a topic client each receive every event
// of their scope exactly once and in order, the other process's and the
// tailing hub's own alike, and so does an in-process subscriber.
func TestContentionTailAcrossProcesses(t *testing.T) {
	if path := os.Getenv(tailChildEnv); path != "" {
		tailChild(path)
		os.Exit(0)
	}
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{HeartbeatInterval: -1}})
	stopTail, err := h.StartTail(5*time.Millisecond, TailOptions{MaxInterval: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer stopTail()
	srv := serve(t, h)

	var subMu sync.Mutex
	var subbed []int64
	unsub := h.Subscribe(func(ev Event) {
		subMu.Lock()
		subbed = append(subbed, ev.Sequence)
		subMu.Unlock()
	})
	defer unsub()

	global := wiretest.Dial(t, srv.URL, nil)
	_, _, cursor, head := global.Hello()
	topicA := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	_, _, cursorA, _ := topicA.Hello()
	if cursor != head || cursorA != head {
		t.Fatalf("fresh cursors %d, %d, head %d", cursor, cursorA, head)
	}

	child := crashStart(t, "TestContentionTailAcrossProcesses", tailChildEnv+"="+path)
	first, ok := child.nextAck(60 * time.Second)
	if !ok {
		t.Fatalf("child acknowledged nothing: %s", child.stderr())
	}
	// Publish here while the child publishes there: one event of our own
	// for every other acknowledgement of the child's.
	rng := rand.New(rand.NewPCG(chaosSeed(t), 1))
	var own []Event
	publishOwn := func(i int) {
		topic := []string{"a", "b", ""}[rng.IntN(3)]
		own = append(own, mustPublish(t, h, topic, map[string]any{"own": i}, WithType("own")))
	}
	childAcks := []crashAck{first}
	for a := range child.acks {
		childAcks = append(childAcks, a)
		if len(childAcks)%2 == 0 && len(own) < 150 {
			publishOwn(len(own))
		}
	}
	for len(own) < 150 {
		publishOwn(len(own))
	}
	if state := child.wait(); !state.Success() {
		t.Fatalf("child: %v: %s", state, child.stderr())
	}
	if len(childAcks) != tailChildCount {
		t.Fatalf("child acknowledged %d events, want %d", len(childAcks), tailChildCount)
	}
	// A final event of our own: after it, nothing else may arrive.
	fence := mustPublish(t, h, "", "fence")
	own = append(own, fence)

	// What the log holds above the clients' cursor is what they must get.
	all, err := h.Replay(context.Background(), "", head, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	isOwn := map[int64]bool{}
	for _, ev := range own {
		isOwn[ev.Sequence] = true
	}
	ofChild := map[int64]string{}
	for _, a := range childAcks {
		ofChild[a.seq] = a.eventID
	}
	if len(all) != len(own)+len(childAcks) {
		t.Fatalf("log holds %d events above %d, %d own and %d from the child were acknowledged", len(all), head, len(own), len(childAcks))
	}
	var interleaved int
	for i, ev := range all {
		if !isOwn[ev.Sequence] && ofChild[ev.Sequence] != ev.EventID {
			t.Fatalf("row %d (%s) was acknowledged by nobody", ev.Sequence, ev.EventID)
		}
		if i > 0 && isOwn[ev.Sequence] != isOwn[all[i-1].Sequence] {
			interleaved++
		}
	}

	for _, c := range []struct {
		name   string
		client *wiretest.Client
		topic  string
	}{{"global", global, ""}, {"topic a", topicA, "a"}} {
		var want []Event
		for _, ev := range all {
			if c.topic == "" || ev.Topic == "" || ev.Topic == c.topic {
				want = append(want, ev)
			}
		}
		got := c.client.Events(len(want))
		for i, f := range got {
			ev := want[i]
			if f.ID != strconv.FormatInt(ev.Sequence, 10) || f.Event != ev.Type || f.Data != string(ev.Payload) {
				t.Fatalf("%s client: event %d is %s %q %q, want %d %q %q (ids %v)", c.name, i, f.ID, f.Event, f.Data,
					ev.Sequence, ev.Type, ev.Payload, wiretest.FrameIDs(got))
			}
		}
		t.Logf("%s client: %d events exactly once, in order", c.name, len(got))
	}
	// The fence was the last event; nothing may follow it (a duplicate
	// would). Bounded: the tail polls every few milliseconds.
	global.Quiet(200 * time.Millisecond)

	subMu.Lock()
	defer subMu.Unlock()
	if !slices.Equal(subbed, seqs(all)) {
		t.Fatalf("subscriber got %d events %v, want %d", len(subbed), subbed, len(all))
	}
	t.Logf("child published %d, this process %d (%d switches between them in the log); subscriber got all %d once, in order",
		len(childAcks), len(own), interleaved, len(subbed))
}

// tailChild publishes tailChildCount events to topics a, b and broadcasts,
// in bursts, printing an acknowledgement for each.
func tailChild(path string) {
	h, db := childHub(path)
	out := crashLineWriter{w: os.Stdout}
	for i := range tailChildCount {
		id := fmt.Sprintf("child-%d", i)
		topic := []string{"a", "b", ""}[i%3]
		ev, err := h.Publish(context.Background(), topic, map[string]any{"child": i, "text": "line one\nline two"},
			WithEventID(id), WithType("from-child"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		out.printf("ack %d %s\n", ev.Sequence, ev.EventID)
		if i%25 == 24 {
			time.Sleep(5 * time.Millisecond) // bursts, so the tail sees both full and partial polls
		}
	}
	h.Close()
	db.Close()
}
