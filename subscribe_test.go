package replayd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/storage"
)

// recordSubscriber records what a SubscribeWithGaps subscriber of h is
// told, in order: "e<seq>" for an event, "gap <reason> <after>
// <from>-<through>" for a gap.
func recordSubscriber(h *EventHub) *wiretest.Recorder {
	r := wiretest.NewRecorder()
	h.SubscribeWithGaps(func(ev Event) { r.Add(fmt.Sprintf("e%d", ev.Sequence)) },
		func(g Gap) { r.Add(fmt.Sprintf("gap %s %d %d-%d", g.Reason, g.After, g.From, g.Through)) })
	return r
}

// resetLog empties the log from outside, as a new database would: every row
// and watermark deleted and the sequence started again.
func resetLog(t testing.TB, path string) {
	t.Helper()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`DELETE FROM events`,
		`DELETE FROM events_prune_watermarks`,
		`UPDATE sqlite_sequence SET seq = 0 WHERE name = 'events'`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

// After the log is reset from outside, the head is below the hub's live
// position. A tailing hub must notice (not wait until the sequence passes
// its old position): it ends its streams, whose clients reconnect with an
// unknown_cursor gap, tells gap subscribers, and then delivers live again,
// to clients connected before and after the reset alike.
func TestTailLogResetDeliversLive(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := serve(t, h)
	var old int64
	for range 5 {
		old = mustPublish(t, h, "a", "old").Sequence
	}
	rec := recordSubscriber(h)
	before := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	before.Hello()

	resetLog(t, path)
	after := wiretest.Dial(t, srv.URL+"?topic=a", nil) // after the reset, before the hub knows
	if _, _, cursor, _ := after.Hello(); cursor != 0 {
		t.Fatalf("hello cursor %d after the reset, want 0", cursor)
	}
	stop, err := h.StartTail(10*time.Millisecond, TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// The tail notices: every stream ends, and subscribers are told.
	before.Ended("connected before the reset")
	after.Ended("connected after the reset")
	want := fmt.Sprintf("gap unknown_cursor %d 1-0", old)
	if got := rec.Wait(t, 1); got[0] != want {
		t.Fatalf("subscriber got %q, want %q", got, want)
	}
	// The clients reconnect with their last ids.
	before = wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(old))
	before.Hello()
	if g := wiretest.MustGap(t, before.Next()); g.Reason != "unknown_cursor" {
		t.Fatalf("gap %s", g.String())
	}
	after = wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0))
	after.Hello()
	late := wiretest.Dial(t, srv.URL+"?topic=a", nil)
	late.Hello()

	// Another process opens the new log (raising its sequence floor) and
	// publishes into it: live for everyone.
	other := secondHub(t, path, Options{})
	ev := mustPublish(t, other, "a", "new")
	for name, c := range map[string]*wiretest.Client{"before": before, "after": after, "late": late} {
		if f := c.NextNonHeartbeat(); f.ID != fmt.Sprint(ev.Sequence) || f.Data != `"new"` {
			t.Fatalf("client connected %s the reset got %+v, want id %d", name, f, ev.Sequence)
		}
	}
	if got := rec.Wait(t, 2); got[1] != fmt.Sprintf("e%d", ev.Sequence) {
		t.Fatalf("subscriber got %q", got)
	}
}

// A hub that publishes into a log reset under it must not drop its own
// events because their sequences are below its live position.
func TestPublishAfterLogResetDeliversLive(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := serve(t, h)
	var old int64
	for range 5 {
		old = mustPublish(t, h, "", "old").Sequence
	}
	rec := recordSubscriber(h)
	c := wiretest.Dial(t, srv.URL, nil)
	c.Hello()

	resetLog(t, path)
	ev := mustPublish(t, h, "", "new")
	want := []string{fmt.Sprintf("gap unknown_cursor %d 1-%d", old, ev.Sequence-1), fmt.Sprintf("e%d", ev.Sequence)}
	if got := rec.Wait(t, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("subscriber got %q, want %q", got, want)
	}
	c.Ended("connected before the reset")
	c = wiretest.Dial(t, srv.URL, wiretest.LastID(old))
	c.Hello()
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "unknown_cursor" {
		t.Fatalf("gap %s", g.String())
	}
	next := mustPublish(t, h, "", "next")
	if f := c.NextNonHeartbeat(); f.ID != fmt.Sprint(next.Sequence) {
		t.Fatalf("after the reset: %+v, want id %d", f, next.Sequence)
	}
}

// faultyStore is a hub's store with faults injected: reads of rows of
// every topic (the live catch-up's) fail while failReads is set.
type faultyStore struct {
	Store
	failReads atomic.Bool
}

func (s *faultyStore) Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error) {
	if len(req.Scope) == 0 && s.failReads.Load() {
		return storage.Page{}, errors.New("injected read failure")
	}
	return s.Store.Read(ctx, req)
}

// Rows another process committed that this hub cannot read (a database
// error) cannot be delivered in order: a gap subscriber is told before the
// next event, and streams end so their clients resume from the log.
func TestSubscribeGapWhenRowsUnreadable(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := serve(t, h)
	other := secondHub(t, path, Options{})

	first := mustPublish(t, h, "", "before")
	fs := &faultyStore{Store: h.store}
	h.store = fs // the writer reads it only after the next publish hands it an event
	rec := recordSubscriber(h)
	c := wiretest.Dial(t, srv.URL, nil)
	c.Hello()
	for range 3 {
		mustPublish(t, other, "a", "unread")
	}
	fs.failReads.Store(true)
	ev := mustPublish(t, h, "", "next")
	want := []string{
		fmt.Sprintf("gap unreadable %d %d-%d", first.Sequence, first.Sequence+1, first.Sequence+3),
		fmt.Sprintf("e%d", ev.Sequence),
	}
	if got := rec.Wait(t, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("subscriber got %q, want %q", got, want)
	}
	c.Ended("connected before the unreadable rows")
}

// The root's Gap is internal/live's, converted: the reasons must agree.
func TestGapReasonsAreLiveDeliverys(t *testing.T) {
	for _, c := range [][2]string{
		{GapPruned, live.GapPruned},
		{GapUnreadable, live.GapUnreadable},
		{GapUnknownCursor, live.GapUnknownCursor},
	} {
		if c[0] != c[1] {
			t.Errorf("root reason %q, internal/live's %q", c[0], c[1])
		}
	}
	_ = Gap(live.Gap{}) // the conversion SubscribeWithGaps makes
}
