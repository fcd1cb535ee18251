package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/storage"
)

// One bad publish in a group-commit batch must not fail its neighbours. No
// row that passes Publish's validation fails in SQLite, so a trigger
// refuses one, and the batch is handed to the writer directly.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	mk := func(ev Event) *publishReq { return &publishReq{ev: ev, res: make(chan publishRes, 1)} }
	good1 := mk(Event{EventID: "g1", Type: "m", Topic: "a", Payload: json.RawMessage(`1`)})
	bad := mk(Event{EventID: "bad", Type: "m", Topic: "a", Payload: json.RawMessage(`0`)})
	good2 := mk(Event{EventID: "g2", Type: "m", Topic: "a", Payload: json.RawMessage(`2`)})
	if _, err := db.Exec(`CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.event_id = 'bad'
		BEGIN SELECT RAISE(ABORT, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	h.commitMu.Lock()
	h.commit(h.writeCtx, []*publishReq{good1, bad, good2})
	h.commitMu.Unlock()
	r1, rb, r2 := <-good1.res, <-bad.res, <-good2.res
	if r1.err != nil || r2.err != nil {
		t.Fatalf("neighbours failed: %v, %v", r1.err, r2.err)
	}
	if rb.err == nil || !strings.Contains(rb.err.Error(), "refused") {
		t.Fatalf("bad publish: %v", rb.err)
	}
	if r1.ev.Sequence == 0 || r2.ev.Sequence <= r1.ev.Sequence {
		t.Fatalf("sequences %d, %d", r1.ev.Sequence, r2.ev.Sequence)
	}
}

func TestPruneByCount(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	ctx := context.Background()
	// Sequences below are relative to b, the head.
	b, _ := h.LatestSequence(ctx)
	for i := range 2500 { // more than one prune batch
		mustPublish(t, h, []string{"a", "b", ""}[i%3], i)
	}
	n, err := h.Prune(ctx, RetentionPolicy{MaxEvents: 10})
	if err != nil || n != 2490 {
		t.Fatalf("pruned %d, %v; want 2490", n, err)
	}
	evs, _ := h.Replay(ctx, "", 0, 100)
	if got := seqs(evs); len(got) != 10 || got[0] != b+2491 || got[9] != b+2500 {
		t.Fatalf("kept %v", got)
	}
	// Watermarks: the highest deleted sequence per topic ('' = broadcast).
	marks := map[string]int64{}
	rows, err := db.Query(`SELECT topic, sequence FROM events_prune_watermarks`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var topic string
		var seq int64
		rows.Scan(&topic, &seq)
		marks[topic] = seq
	}
	rows.Close()
	// Sequence s has topic index (s-1)%3: 2488 -> a, 2489 -> b, 2490 -> "".
	if want := map[string]int64{"a": b + 2488, "b": b + 2489, "": b + 2490}; fmt.Sprint(marks) != fmt.Sprint(want) {
		t.Fatalf("watermarks %v, want %v", marks, want)
	}
	if n, err := h.Prune(ctx, RetentionPolicy{MaxEvents: 10}); err != nil || n != 0 {
		t.Fatalf("second prune deleted %d, %v", n, err)
	}
	if n, err := h.Prune(ctx, RetentionPolicy{}); err != nil || n != 0 {
		t.Fatalf("empty policy deleted %d, %v", n, err)
	}
}

func TestPruneByAge(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	ctx := context.Background()
	old := []Event{mustPublish(t, h, "a", 1), mustPublish(t, h, "b", 2)}
	// Age the first two rows by an hour, as if published long ago.
	if _, err := db.Exec(`UPDATE events SET created_at = created_at - 3600000`); err != nil {
		t.Fatal(err)
	}
	fresh := mustPublish(t, h, "a", 3)
	n, err := h.Prune(ctx, RetentionPolicy{MaxAge: 30 * time.Minute})
	if err != nil || n != 2 {
		t.Fatalf("pruned %d, %v; want 2", n, err)
	}
	evs, _ := h.Replay(ctx, "", 0, 10)
	if got := seqs(evs); !slices.Equal(got, []int64{fresh.Sequence}) {
		t.Fatalf("kept %v; old were %v", got, seqs(old))
	}
}

func TestPruneByCountAndAge(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	ctx := context.Background()
	var second int64
	for i := range 6 {
		if ev := mustPublish(t, h, "a", i); i == 1 {
			second = ev.Sequence
		}
	}
	if _, err := db.Exec(`UPDATE events SET created_at = created_at - 3600000 WHERE sequence <= ?`, second); err != nil {
		t.Fatal(err)
	}
	// Count alone would delete 1 (keep 5); age deletes 2: whichever is more.
	n, err := h.Prune(ctx, RetentionPolicy{MaxEvents: 5, MaxAge: time.Minute})
	if err != nil || n != 2 {
		t.Fatalf("pruned %d, %v; want 2", n, err)
	}
	// Now count deletes more than age.
	n, err = h.Prune(ctx, RetentionPolicy{MaxEvents: 1, MaxAge: time.Minute})
	if err != nil || n != 3 {
		t.Fatalf("pruned %d, %v; want 3", n, err)
	}
}

func TestTailIdleReadsOnlyHead(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	counting := &countingStore{Store: h.store}
	h.store = counting
	stop, err := h.StartTail(time.Millisecond, TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	wiretest.WaitUntil(t, "20 idle polls", func() bool { return counting.heads.Load() >= 20 })
	if n := counting.reads.Load(); n != 0 {
		t.Fatalf("idle tail read rows %d times", n)
	}
	mustPublish(t, h, "a", 1) // its own publish: delivered without a read
	wiretest.WaitUntil(t, "another idle poll", func() bool { return counting.heads.Load() >= 30 })
	stop()
	if n := counting.reads.Load(); n != 0 {
		t.Fatalf("tail re-read the hub's own publish %d times", n)
	}
}

func TestTailBacksOffWhileIdle(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	counting := &countingStore{Store: h.store}
	h.store = counting
	stop, err := h.StartTail(time.Millisecond, TailOptions{MaxInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// The first poll is immediate; then, doubling from 1ms to 200ms, the
	// next nine wait 1+2+4+...+128+200 = 455ms in all; at a fixed 1ms they
	// would take about 10ms.
	start := time.Now()
	wiretest.WaitUntil(t, "10 polls", func() bool { return counting.heads.Load() >= 10 })
	if elapsed := time.Since(start); elapsed < 450*time.Millisecond {
		t.Fatalf("10 idle polls took %v: no back-off", elapsed)
	}
}

// Close leaves the *sql.DB open: the caller owns it. (What Close stops:
// hubtest's CloseStopsEverything.)
func TestCloseLeavesTheDBOpen(t *testing.T) {
	db, _ := openTestDB(t)
	h, err := New(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustPublish(t, h, "a", 1)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("db closed by hub: %v", err)
	}
}

func TestMemoryDBConcurrentUse(t *testing.T) {
	db, err := OpenDB(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	h := newTestHub(t, db, Options{})
	ctx := context.Background()
	base, _ := h.LatestSequence(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := h.Publish(ctx, fmt.Sprint("t", w), i); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 50 {
				if _, err := h.Replay(ctx, fmt.Sprint("t", w), base+rand.Int64N(100), 10); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if head, err := h.LatestSequence(ctx); err != nil || head != base+200 {
		t.Fatalf("head %d, %v", head, err)
	}
}

func TestEnsureSchemaIdempotent(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	for range 2 {
		if err := h.EnsureSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Someone else's table of the same name is refused, not used.
	other, _ := openTestDB(t)
	if _, err := other.Exec(`CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT)`); err != nil {
		t.Fatal(err)
	}
	if _, err := New(other, Options{}); err == nil || !strings.Contains(err.Error(), "not replayd's") {
		t.Fatalf("New on a foreign events table: %v", err)
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	if _, err := New(db, Options{DefaultType: "a\nb"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad DefaultType: %v", err)
	}
}

func TestStatsAndTracker(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := serve(t, h)
	ev := mustPublish(t, h, "a", 1)
	a1 := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	a1.Hello()
	a2 := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	a2.Hello()
	g := wiretest.Dial(t, srv.URL, nil)
	g.Hello()
	st, err := h.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.LatestSequence != ev.Sequence || len(st.Topics) != 2 || st.Topics[0].Topic != "" || st.Topics[0].ActiveClients != 1 ||
		st.Topics[1].Topic != "a" || st.Topics[1].ActiveClients != 2 || st.Topics[1].LastActiveAt.IsZero() {
		t.Fatalf("stats %+v", st)
	}
	if h.Clients().Total() != 3 || h.Clients().ActiveClients("a") != 2 {
		t.Fatalf("tracker total %d", h.Clients().Total())
	}
	a1.Close()
	a2.Close()
	wiretest.WaitUntil(t, "tracker to see the disconnects", func() bool { return h.Clients().ActiveClients("a") == 0 })
	// The subscriptions are gone too.
	subs := h.live.StreamsOf("a")
	if subs != 0 {
		t.Fatalf("%d subscriptions left on topic a", subs)
	}
	st, _ = h.Stats(context.Background())
	if len(st.Topics) != 2 || st.Topics[1].ActiveClients != 0 {
		t.Fatalf("topic entry must stay with 0 clients: %+v", st)
	}
}

// countingStore counts the tail's head checks and row reads.
type countingStore struct {
	Store
	heads, reads atomic.Int64
}

func (c *countingStore) Head(ctx context.Context) (int64, error) {
	c.heads.Add(1)
	return c.Store.Head(ctx)
}

func (c *countingStore) Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error) {
	c.reads.Add(1)
	return c.Store.Read(ctx, req)
}

// recordLive subscribes to h until the test ends and returns a function
// that reports the sequences delivered so far.
func recordLive(t testing.TB, h *EventHub) func() []int64 {
	var seen wiretest.Seqs
	t.Cleanup(h.Subscribe(func(ev Event) { seen.Add(ev.Sequence) }))
	return seen.Seen
}
