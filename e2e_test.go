package replayd

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// End-to-end tests of the SSE endpoint over real HTTP and real SQLite files.

// A publish racing the handshake, between subscribing and reading the log,
// is both in the replay and in the live queue: it arrives exactly once.
func TestSSEHandshakeRaceBeforeRead(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	first := mustPublish(t, h, "a", 1)
	var once sync.Once
	var raced Event
	h.testHookAfterSubscribe = func() { once.Do(func() { raced = mustPublish(t, h, "a", "raced") }) }
	srv := serve(t, h) // after setting the hook, which the handler reads
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0))
	c.Hello()
	next := mustPublish(t, h, "a", "after")
	if got := wiretest.FrameIDs(c.Events(3)); !slices.Equal(got, []string{fmt.Sprint(first.Sequence), fmt.Sprint(raced.Sequence), fmt.Sprint(next.Sequence)}) {
		t.Fatalf("got %v", got)
	}
}

// A publish between the replay and going live is queued, and delivered
// exactly once after the replay.
func TestSSEHandshakeRaceBeforeLive(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	first := mustPublish(t, h, "a", 1)
	var once sync.Once
	var raced Event
	hooked := make(chan struct{})
	h.testHookBeforeLive = func() {
		once.Do(func() {
			raced = mustPublish(t, h, "a", "raced")
			close(hooked)
		})
	}
	srv := serve(t, h)
	c := wiretest.Dial(t, srv.URL+"?topic=a", wiretest.LastID(0))
	c.Hello()
	select {
	case <-hooked:
	case <-time.After(waitFor):
		t.Fatal("the hook never ran")
	}
	next := mustPublish(t, h, "a", "after")
	if got := wiretest.FrameIDs(c.Events(3)); !slices.Equal(got, []string{fmt.Sprint(first.Sequence), fmt.Sprint(raced.Sequence), fmt.Sprint(next.Sequence)}) {
		t.Fatalf("got %v", got)
	}
}
