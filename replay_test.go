package replayd

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// Rows pruned between two pages of a replay would be a silent hole: the
// stream ends instead, and the reconnect gets a pruned gap naming them.
func TestReplayPruneBetweenPagesEndsStream(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	b := mustPublish(t, h, "a", 0).Sequence - 1 // sequences below are relative to b
	for i := 1; i < 200; i++ {
		mustPublish(t, h, "a", i)
	}
	h.testHookReplayPage = func(last int64) {
		if last == b+164 {
			if _, err := h.Prune(t.Context(), RetentionPolicy{MaxEvents: 20}); err != nil {
				t.Error(err)
			}
		}
	}
	srv := serve(t, h)
	c := wiretest.Dial(t, srv.URL+"?topic=a", http.Header{"Last-Event-ID": {"0"}})
	c.Hello()
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "replay_limit" || *g.Missed != 100 || *g.MissedThrough != b+100 {
		t.Fatalf("gap %+v", g)
	}
	for want := b + 101; want <= b+164; want++ {
		if f := c.Next(); f.ID != fmt.Sprint(want) {
			t.Fatalf("replayed id %q, want %d", f.ID, want)
		}
	}
	if f, err := c.NextErr(waitFor); err == nil {
		t.Fatalf("after rows were pruned mid-replay the stream went on with %+v", f)
	} else if err == wiretest.ErrTimeout {
		t.Fatal("the stream neither ended nor went on")
	}
	h.testHookReplayPage = nil
	c2 := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(b+164))
	c2.Hello()
	g := wiretest.MustGap(t, c2.Next())
	if g.Reason != "pruned" || *g.MissedFrom != b+165 || *g.MissedThrough != b+180 {
		t.Fatalf("reconnect gap %+v", g)
	}
	for want := b + 181; want <= b+200; want++ {
		if f := c2.Next(); f.ID != fmt.Sprint(want) {
			t.Fatalf("replayed id %q, want %d", f.ID, want)
		}
	}
}

// Close ends every stream in replay at once, also with a thousand of them
// stalled mid-replay (issue 8, item 2: measured target 1 s).
func TestCloseManyClientsMidReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("a thousand connections")
	}
	loadRaiseNoFile(t, 8192)
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	const events, clients = 100, 1000 // the default ReplayLimit: all replayed
	payload := json.RawMessage(`"` + strings.Repeat("y", 16<<10) + `"`)
	for range events {
		mustPublish(t, h, "", payload)
	}
	var live atomic.Int64 // streams that finished their replay
	h.testHookBeforeLive = func() { live.Add(1) }
	// Small send buffers (16 KiB) stall each stream within its first pages
	// and keep the kernel's socket memory small.
	srvURL := chaosServe(t, h.Handler())
	conns := make(chan net.Conn, clients)
	errs := make(chan error, clients)
	sem := make(chan struct{}, 50)
	for range clients {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			conn, err := wiretest.StalledConn(srvURL, 0, 4<<10)
			if conn != nil {
				conns <- conn
			}
			errs <- err
		}()
	}
	defer func() {
		for range len(conns) {
			(<-conns).Close()
		}
	}()
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := live.Load(); n > 0 {
		t.Fatalf("%d streams finished their replay: not stalled", n)
	}
	start := time.Now()
	h.Close()
	took := time.Since(start)
	t.Logf("Close took %v with %d clients stalled mid-replay of %d events of 16 KiB", took, clients, events)
	if took > 2*time.Second {
		t.Fatalf("Close took %v", took)
	}
}
