package replaydpg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

func TestAppend(t *testing.T) {
	t.Parallel()
	s, _ := openTestStore(t)
	ctx := testCtx(t, 30*time.Second)
	b, err := s.Head(ctx) // the sequence floor: sequences below are relative to it
	if err != nil {
		t.Fatal(err)
	}

	first := mustAppend(t, s, ev("a", "room", `{"x": 1}`), ev("b", "", `"é ✓"`))
	if first[0].Event.Sequence != b+1 || first[1].Event.Sequence != b+2 {
		t.Fatalf("sequences %d, %d; want %d, %d", first[0].Event.Sequence, first[1].Event.Sequence, b+1, b+2)
	}
	if first[1].Event.Topic != "" || first[0].Event.Topic != "room" {
		t.Fatalf("topics %q, %q", first[0].Event.Topic, first[1].Event.Topic)
	}

	// A stored id, an id repeated within the batch, an invalid payload
	// among valid ones: only the invalid one fails, duplicates take no
	// sequence and come back as the stored originals.
	res, err := s.Append(ctx, []replayd.Event{
		ev("c", "room", `{"y":2}`),
		ev("a", "other", `{"changed":true}`),
		ev("bad", "room", "\"\xff\""),
		ev("c", "room", `{"y":3}`),
		ev("d", "", `[1,  2]`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[2].Err, replayd.ErrInvalid) {
		t.Fatalf("invalid UTF-8: err = %v, want ErrInvalid", res[2].Err)
	}
	for i, want := range []struct {
		seq     int64
		dup     bool
		topic   string
		payload string
	}{{3, false, "room", `{"y":2}`}, {1, true, "room", `{"x": 1}`}, {}, {3, true, "room", `{"y":2}`}, {4, false, "", `[1,  2]`}} {
		if i == 2 {
			continue
		}
		r := res[i]
		if r.Err != nil || r.Event.Sequence != b+want.seq || r.Duplicate != want.dup || r.Event.Topic != want.topic || string(r.Event.Payload) != want.payload {
			t.Errorf("result %d = %+v (payload %s), want seq %d dup %v topic %q payload %s", i, r, r.Event.Payload, want.seq, want.dup, want.topic, want.payload)
		}
	}

	all := allEvents(t, s)
	if len(all) != 4 {
		t.Fatalf("%d rows stored, want 4", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i].CreatedAt.Before(all[i-1].CreatedAt) {
			t.Errorf("created_at decreases: %v then %v", all[i-1].CreatedAt, all[i].CreatedAt)
		}
	}
	if head, err := s.Head(ctx); err != nil || head != b+4 {
		t.Fatalf("head = %d, %v; want %d", head, err, b+4)
	}

	// A batch of only refused events sends nothing and fails nothing else.
	res, err = s.Append(ctx, []replayd.Event{ev("nul", "", "\"a\x00\"")})
	if err != nil || !errors.Is(res[0].Err, replayd.ErrInvalid) {
		t.Fatalf("NUL payload: %v, %+v", err, res)
	}
}

// TestCreatedAtNeverDecreases steps the head row's created_at into the
// future, as a clock that stepped back would leave it: the next batch must
// not go below it.
func TestCreatedAtNeverDecreases(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	mustAppend(t, s, ev("a", "", `1`))
	future := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	if _, err := testPool(t).Exec(context.Background(), "UPDATE "+prefix+"head SET created_at = $1", future); err != nil {
		t.Fatal(err)
	}
	r := mustAppend(t, s, ev("b", "", `2`))
	if !r[0].Event.CreatedAt.Equal(future) {
		t.Fatalf("created_at %v, want %v", r[0].Event.CreatedAt, future)
	}
}

func TestOpen(t *testing.T) {
	t.Parallel()
	dsn := testDSN(t)
	ctx := testCtx(t, 30*time.Second)
	if _, err := Open(ctx, dsn, WithTablePrefix("Bad-Prefix")); !errors.Is(err, replayd.ErrInvalid) {
		t.Fatalf("bad prefix: err = %v, want ErrInvalid", err)
	}
	prefix := testPrefix(t)
	if _, err := testPool(t).Exec(ctx, "CREATE TABLE "+prefix+"events (id int)"); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(ctx, dsn, WithTablePrefix(prefix)); err == nil {
		s.Close()
		t.Fatal("Open accepted a foreign events table")
	}

	// Nodes starting together all get the schema, once.
	prefix = testPrefix(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			s, err := Open(ctx, dsn, WithTablePrefix(prefix))
			if err == nil {
				err = s.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s := openPrefix(t, prefix)
	s.Close()
	if _, err := s.Head(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Head after Close: %v, want ErrClosed", err)
	}
}

// watermarks reads the watermark table as it is.
func watermarks(t testing.TB, prefix string) map[string]int64 {
	t.Helper()
	rows, err := testPool(t).Query(context.Background(), "SELECT topic, sequence FROM "+prefix+"watermarks")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]int64{}
	for rows.Next() {
		var (
			topic string
			seq   int64
		)
		if err := rows.Scan(&topic, &seq); err != nil {
			t.Fatal(err)
		}
		m[topic] = seq
	}
	return m
}

func inScope(topics []string, ev replayd.Event) bool {
	return len(topics) == 0 || ev.Topic == "" || slices.Contains(topics, ev.Topic)
}

func scopeMark(marks map[string]int64, topics []string) int64 {
	var p int64
	for topic, seq := range marks {
		if len(topics) == 0 || topic == "" || slices.Contains(topics, topic) {
			p = max(p, seq)
		}
	}
	return p
}

// handshake is what the hub reads for a connecting client: the head, the
// scope's watermark, the events it skips and the replay window.
type handshake struct {
	Head, Watermark                         int64
	SkippedCount, SkippedFirst, SkippedLast int64
	Replay                                  []replayd.Event
}

// readHandshake reads a handshake through the contract, as the hub does:
// Window, then the window's events with Read. For a cursor at or above the
// head only the head is read (the watermark is then the model's, unread).
func readHandshake(ctx context.Context, s *Store, topics []string, cursor int64, limit int) (handshake, error) {
	if cursor < 0 {
		head, err := s.Head(ctx)
		return handshake{Head: head}, err
	}
	w, err := s.Window(ctx, topics, cursor, limit)
	if err != nil || cursor >= w.Head || w.Foreign {
		return handshake{Head: w.Head}, err
	}
	hs := handshake{Head: w.Head, Watermark: w.Watermark, SkippedCount: w.Skipped.Count, SkippedFirst: w.Skipped.First, SkippedLast: w.Skipped.Last}
	if w.From <= w.Head {
		p, err := s.Read(ctx, storage.ReadRequest{Scope: topics, After: max(cursor, w.From-1), Through: w.Head, Limit: max(limit, 1)})
		if err != nil {
			return hs, err
		}
		hs.Replay = p.Events
	}
	return hs, nil
}

// modelHandshake is the handshake (PROTOCOL.md, gap) computed the slow way from the whole log.
// A cursor strictly between 0 and floor (the head when the log was first
// opened) is foreign, like one above the head: only the head is read.
func modelHandshake(all []replayd.Event, marks map[string]int64, head, floor int64, topics []string, cursor int64, limit int) handshake {
	hs := handshake{Head: head, Watermark: scopeMark(marks, topics)}
	if cursor < 0 || cursor >= head || (cursor > 0 && cursor < floor) {
		hs.Watermark = 0 // not read
		return hs
	}
	if cursor < 0 {
		return hs
	}
	var v []replayd.Event
	for _, e := range all {
		if e.Sequence > cursor && inScope(topics, e) {
			v = append(v, e)
		}
	}
	w := v[max(len(v)-limit, 0):]
	if m := v[:len(v)-len(w)]; len(m) > 0 {
		hs.SkippedCount, hs.SkippedFirst, hs.SkippedLast = int64(len(m)), m[0].Sequence, m[len(m)-1].Sequence
	}
	hs.Replay = w
	return hs
}

func sequences(evs []replayd.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Sequence
	}
	return out
}

// TestHandshakeAndPollMatchModel compares Window and Read (a handshake, a
// poll) with the gap rules
// and the poll transport computed from the whole log, over scopes, cursors and limits, on a
// log with duplicates and a pruned prefix.
func TestHandshakeAndPollMatchModel(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	ctx := testCtx(t, 60*time.Second)
	floor, err := s.Head(ctx) // the sequence floor: cursors below it are foreign
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	topics := []string{"a", "b", "c", "", "a", "a", "b"}
	var batch []replayd.Event
	for i := range 3000 {
		id := fmt.Sprintf("e%d", i)
		if i%97 == 0 && i > 0 {
			id = fmt.Sprintf("e%d", i-1) // a duplicate
		}
		batch = append(batch, ev(id, topics[rng.IntN(len(topics))], fmt.Sprintf(`{"i":%d}`, i)))
		if len(batch) == 1+rng.IntN(300) {
			if _, err := s.Append(ctx, batch); err != nil {
				t.Fatal(err)
			}
			batch = nil
		}
	}
	mustAppend(t, s, batch...)
	if _, err := s.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 1800}); err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 400, []string{"b", "", "c"}, "late")

	all := allEvents(t, s)
	marks := watermarks(t, prefix)
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1800+400 || head != all[len(all)-1].Sequence {
		t.Fatalf("%d rows, head %d, last %d", len(all), head, all[len(all)-1].Sequence)
	}
	p := marks["a"]
	cursors := []int64{-1, 0, 1, p - 1, p, p + 1, all[0].Sequence, all[len(all)/2].Sequence, head - 50, head - 1, head, head + 7}
	scopes := [][]string{nil, {"a"}, {"b", "c"}, {"c", "a", "b", "a"}, {"nobody"}}
	for _, topics := range scopes {
		for _, cursor := range cursors {
			for _, limit := range []int{0, 1, 7, 100, 5000} {
				got, err := readHandshake(ctx, s, topics, cursor, limit)
				if err != nil {
					t.Fatal(err)
				}
				want := modelHandshake(all, marks, head, floor, topics, cursor, limit)
				if !reflect.DeepEqual(sequences(got.Replay), sequences(want.Replay)) ||
					got.Head != want.Head || got.Watermark != want.Watermark ||
					got.SkippedCount != want.SkippedCount || got.SkippedFirst != want.SkippedFirst || got.SkippedLast != want.SkippedLast {
					t.Fatalf("Handshake(%q, %d, %d):\n got  head %d mark %d skipped %d [%d, %d] replay %v\n want head %d mark %d skipped %d [%d, %d] replay %v",
						topics, cursor, limit,
						got.Head, got.Watermark, got.SkippedCount, got.SkippedFirst, got.SkippedLast, sequences(got.Replay),
						want.Head, want.Watermark, want.SkippedCount, want.SkippedFirst, want.SkippedLast, sequences(want.Replay))
				}
				if cursor < 0 || limit == 0 {
					continue
				}
				pp, err := s.Read(ctx, storage.ReadRequest{Scope: topics, After: cursor, Limit: limit})
				if err != nil {
					t.Fatal(err)
				}
				var v []replayd.Event
				for _, e := range all {
					if e.Sequence > cursor && inScope(topics, e) {
						v = append(v, e)
					}
				}
				wantEvs := v[:min(limit, len(v))]
				if !reflect.DeepEqual(sequences(pp.Events), sequences(wantEvs)) || pp.More != (len(v) > limit) ||
					pp.Head != head || pp.Watermark != scopeMark(marks, topics) {
					t.Fatalf("Poll(%q, %d, %d) = %v more %v head %d mark %d; want %v more %v head %d mark %d",
						topics, cursor, limit, sequences(pp.Events), pp.More, pp.Head, pp.Watermark,
						sequences(wantEvs), len(v) > limit, head, scopeMark(marks, topics))
				}
			}
		}
	}
	if _, err := s.Window(ctx, []string{"a", ""}, 0, 1); !errors.Is(err, replayd.ErrInvalid) {
		t.Fatalf("empty topic in a scope: err = %v, want ErrInvalid", err)
	}
}

func TestPrune(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	ctx := testCtx(t, 60*time.Second)
	b, err := s.Head(ctx) // the sequence floor: sequences below are relative to it
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 2500, []string{"a", "b", ""}, "old")

	n, err := s.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 1000})
	if err != nil || n != 1500 {
		t.Fatalf("Prune = %d, %v; want 1500", n, err)
	}
	// Rows 1..1500 are gone; row i has topic topics[(i-1)%3].
	if got, want := watermarks(t, prefix), map[string]int64{"a": b + 1498, "b": b + 1499, "": b + 1500}; !reflect.DeepEqual(got, want) {
		t.Fatalf("watermarks %v, want %v", got, want)
	}
	if p, err := s.Read(ctx, storage.ReadRequest{After: b + 2500}); err != nil || p.Watermark != b+1500 {
		t.Fatalf("the global watermark = %d, %v; want 1500", p.Watermark, err)
	}
	if n, err := s.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 1000}); err != nil || n != 0 {
		t.Fatalf("second Prune = %d, %v; want 0", n, err)
	}

	// By age, on the server's clock: everything older than the cut.
	time.Sleep(20 * time.Millisecond) // created_at must differ from the next batch's
	cut := time.Now()
	time.Sleep(20 * time.Millisecond)
	appendN(t, s, 10, []string{"a"}, "new")
	n, err = s.Prune(ctx, replayd.RetentionPolicy{MaxAge: time.Since(cut)})
	if err != nil || n != 1000 {
		t.Fatalf("age Prune = %d, %v; want 1000", n, err)
	}
	// Pruning everything leaves the head where it was.
	if n, err := s.Prune(ctx, replayd.RetentionPolicy{MaxAge: time.Nanosecond * 1000}); err != nil || n != 10 {
		t.Fatalf("prune all = %d, %v; want 10", n, err)
	}
	if head, err := s.Head(ctx); err != nil || head != b+2510 {
		t.Fatalf("head after pruning all = %d, %v; want %d", head, err, b+2510)
	}
	if r := mustAppend(t, s, ev("after", "a", `1`)); r[0].Event.Sequence != b+2511 {
		t.Fatalf("next sequence %d, want %d", r[0].Event.Sequence, b+2511)
	}
	hs, err := readHandshake(ctx, s, []string{"a"}, 0, 10)
	if err != nil || len(hs.Replay) != 1 || hs.Watermark != b+2510 || hs.SkippedCount != 0 {
		t.Fatalf("handshake after prune-all: %+v, %v", hs, err)
	}
}

// TestPruneTwoNodes prunes from two stores at once while a third appends:
// every row is deleted once, the survivors are the newest, and the counts
// the nodes report add up.
func TestPruneTwoNodes(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	other := openPrefix(t, prefix)
	ctx := testCtx(t, 60*time.Second)
	b, err := s.Head(ctx) // the sequence floor: sequences below are relative to it
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 6000, []string{"a", "b", "c", ""}, "x")
	var (
		wg    sync.WaitGroup
		total [2]int64
	)
	for i, st := range []*Store{s, other} {
		wg.Go(func() {
			n, err := st.Prune(ctx, replayd.RetentionPolicy{MaxEvents: 500})
			if err != nil {
				t.Error(err)
			}
			total[i] = n
		})
	}
	wg.Wait()
	if total[0]+total[1] != 5500 {
		t.Fatalf("nodes deleted %d + %d, want 5500 in all", total[0], total[1])
	}
	all := allEvents(t, s)
	if len(all) != 500 || all[0].Sequence != b+5501 {
		t.Fatalf("%d rows left from %d", len(all), all[0].Sequence)
	}
}

// TestWaitForAppend: a second node's waiter is woken by the first node's
// append, returns at once when the head is already above its cursor, and
// returns on ctx and on Close.
func TestWaitForAppend(t *testing.T) {
	t.Parallel()
	a, prefix := openTestStore(t)
	b := openPrefix(t, prefix)
	ctx := testCtx(t, 30*time.Second)
	head, err := b.Head(ctx) // the sequence floor: not 0
	if err != nil {
		t.Fatal(err)
	}

	woke := make(chan error, 1)
	go func() { woke <- b.WaitForAppend(ctx, head) }()
	first := mustAppend(t, a, ev("1", "x", `1`))[0].Event.Sequence
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	if err := b.WaitForAppend(ctx, head); err != nil { // already above
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := b.WaitForAppend(short, first); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("nothing appended: err = %v, want DeadlineExceeded", err)
	}

	// A notification wakes a waiter within milliseconds; the batch of
	// many events wakes it once.
	const rounds = 20
	var lat []time.Duration
	for i := range rounds {
		done := make(chan error, 1)
		head := first + int64(i)
		ready := make(chan struct{})
		go func() {
			close(ready)
			done <- b.WaitForAppend(ctx, head)
		}()
		<-ready
		start := time.Now()
		mustAppend(t, a, ev(fmt.Sprintf("n%d", i), "", `1`))
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("append → wake-up on another store: p50 %v, max %v (append round trip included)", lat[rounds/2], lat[rounds-1])

	closed := make(chan error, 1)
	go func() { closed <- b.WaitForAppend(ctx, 1<<62) }()
	b.Close()
	if err := <-closed; !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// TestListenerReconnects kills the listener's backend: the waiter must
// still learn of a batch committed while it was away, from the head read
// after the new LISTEN.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	a, prefix := openTestStore(t)
	b := openPrefix(t, prefix)
	ctx := testCtx(t, 30*time.Second)
	first := mustAppend(t, a, ev("1", "", `1`))[0].Event.Sequence
	if err := b.WaitForAppend(ctx, first-1); err != nil {
		t.Fatal(err)
	}
	// The listener's last query is the head read after its LISTEN, on this
	// test's own tables.
	pool := testPool(t)
	tag, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND application_name = 'replayd listener' AND query = $1`, b.q.head)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("terminate listener: %v, %v", tag, err)
	}
	mustAppend(t, a, ev("2", "", `2`)) // probably while no one listens
	if err := b.WaitForAppend(ctx, first); err != nil {
		t.Fatal(err)
	}
}

// TestOneNotifyPerBatch listens on the store's channel: a batch of 100
// events is one notification carrying the new head, a batch of only
// duplicates none.
func TestOneNotifyPerBatch(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	ctx := testCtx(t, 30*time.Second)
	conn, err := testPool(t).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN "`+prefix+`events"`); err != nil {
		t.Fatal(err)
	}
	base, err := s.Head(ctx) // the sequence floor: sequences go on from it
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 100, []string{"a", ""}, "n")
	mustAppend(t, s, ev("n-5", "a", `1`)) // a duplicate: nothing committed
	mustAppend(t, s, ev("last", "a", `1`))
	for _, want := range []string{fmt.Sprint(base + 100), fmt.Sprint(base + 101)} {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Payload != want {
			t.Fatalf("notification %q, want %q", n.Payload, want)
		}
	}
}
