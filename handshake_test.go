package replayd

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// A storm of slow handshakes must queue handshakes only: a publish that
// needs the writer's connection and a live catch-up that needs a read of
// rows another process committed both go through (issue 8, item 1).
func TestHandshakeStormDoesNotStallPublish(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	for i := range 10 {
		mustPublish(t, h, "a", i)
	}
	got := make(chan int64, 100)
	unsub := h.Subscribe(func(ev Event) { got <- ev.Sequence })
	defer unsub()

	// Every handshake that reaches the log holds its connection until
	// release is closed.
	entered := make(chan struct{}, 100)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	h.store.s.(*sqliteStore).testHookHandshake = func() {
		entered <- struct{}{}
		<-release
	}
	srv := serve(t, h)
	const storm = 20
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); unblock(); wg.Wait() }()
	hellos := make(chan bool, storm)
	for range storm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"?topic=a", nil)
			req.Header.Set("Last-Event-ID", "0")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				hellos <- false
				return
			}
			defer resp.Body.Close()
			frames := make(chan frame, 64)
			go wiretest.ReadFrames(resp.Body, frames)
			select {
			case f := <-frames:
				hellos <- f.Event == "hello"
			case <-ctx.Done():
				hellos <- false
			}
		}()
	}
	for range handshakeSlots(db.Stats().MaxOpenConnections) {
		select {
		case <-entered:
		case <-time.After(waitFor):
			t.Fatal("no handshake reached the log")
		}
	}

	// Another process commits three rows; this hub's next publish must
	// catch up on them (a pooled read) and commit its own (the writer).
	h2 := secondHub(t, path, Options{})
	var want []int64
	for i := range 3 {
		want = append(want, mustPublish(t, h2, "b", i).Sequence)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	start := time.Now()
	ev, err := h.Publish(pctx, "a", "during the storm")
	if err != nil {
		t.Fatalf("publish during a handshake storm: %v after %v", err, time.Since(start))
	}
	if ev.Sequence != want[2]+1 {
		t.Fatalf("published sequence %d, want %d", ev.Sequence, want[2]+1)
	}
	for _, want := range append(want, ev.Sequence) {
		select {
		case seq := <-got:
			if seq != want {
				t.Fatalf("subscriber got %d, want %d", seq, want)
			}
		case <-time.After(waitFor):
			t.Fatalf("subscriber never got %d", want)
		}
	}
	unblock()
	for range storm {
		select {
		case ok := <-hellos:
			if !ok {
				t.Fatal("a client of the storm got no hello")
			}
		case <-time.After(waitFor):
			t.Fatal("the storm's clients were not all served")
		}
	}
}
