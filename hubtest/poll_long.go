package hubtest

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

func testPollLongPollWokenByPublish(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	head := mustPublish(t, h, "a", 0).Sequence

	type result struct {
		p   wiretest.PollAnswer
		err error
	}
	ask := func(query string) chan result {
		ch := make(chan result, 1)
		go func() {
			status, _, body := wiretest.GetPoll(t, base, query)
			var p wiretest.PollAnswer
			err := json.Unmarshal(body, &p)
			if status != 200 && err == nil {
				err = fmt.Errorf("status %d", status)
			}
			ch <- result{p, err}
		}()
		return ch
	}
	waitWaiters := func(n int) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for h.Metrics().PollConnections != int64(n) {
			if time.Now().After(deadline) {
				t.Fatalf("%d polls waiting, want %d", h.Metrics().PollConnections, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	onA := ask(fmt.Sprintf("topic=a&cursor=%d&wait=20", head))
	fresh := ask("topic=a&wait=20")
	onB := ask(fmt.Sprintf("topic=b&cursor=%d&wait=0.3", head))
	waitWaiters(3)
	// An event of another topic wakes neither a-poll; b's wait runs out.
	mustPublish(t, h, "c", "invisible")
	r := <-onB
	if r.err != nil || len(r.p.Events) != 0 || r.p.Cursor != head || r.p.Gap != nil {
		t.Fatalf("b timed out with %+v %v", r.p, r.err)
	}
	select {
	case r := <-onA:
		t.Fatalf("woken by another topic's event: %+v", r.p)
	default:
	}
	ev := mustPublish(t, h, "a", "wake")
	for _, ch := range []chan result{onA, fresh} {
		r := <-ch
		if r.err != nil || !slices.Equal(r.p.IDs(), []int64{ev.Sequence}) || r.p.Cursor != ev.Sequence {
			t.Fatalf("woken poll: %+v %v", r.p, r.err)
		}
	}
	waitWaiters(0)
	// A broadcast wakes a topic's poll.
	onA = ask(fmt.Sprintf("topic=a&cursor=%d&wait=20", ev.Sequence))
	waitWaiters(1)
	bc := mustPublish(t, h, "", "broadcast")
	if r := <-onA; r.err != nil || !slices.Equal(r.p.IDs(), []int64{bc.Sequence}) {
		t.Fatalf("broadcast: %+v %v", r.p, r.err)
	}
}

func testPollCloseAnswersWaitingPolls(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := wiretest.ServePoll(t, h)
	const n = 20
	done := make(chan wiretest.PollAnswer, n)
	for i := range n {
		go func() { done <- wiretest.Poll(t, base, fmt.Sprintf("topic=t%d&cursor=0&wait=30", i%3)) }()
	}
	deadline := time.Now().Add(waitFor)
	for h.Metrics().PollConnections != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d polls waiting", h.Metrics().PollConnections)
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	h.Close()
	for range n {
		select {
		case p := <-done:
			if len(p.Events) != 0 {
				t.Fatalf("answered %+v", p)
			}
		case <-time.After(waitFor):
			t.Fatal("a waiting poll was not answered after Close")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close answered the polls in %v", d)
	}
}

// A waiting long poll is woken by another hub's row, through the tail:
// the hub of another process or node on the same log. (The root package's
// TestPollLongPollWokenThroughTail has the row come from a real second
// process on SQLite.)
func testPollLongPollWokenThroughTailFromAnotherHub(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	stop, err := h.StartTail(10*time.Millisecond, replayd.TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	base := wiretest.ServePoll(t, h)
	answer := wiretest.PollLater(t, base, "topic=a&cursor=0&wait=20")
	wiretest.WaitUntil(t, "the poll to wait", func() bool { return h.Metrics().PollConnections == 1 })
	other := open(replayd.Options{})
	mustPublish(t, other, "a", "from the other hub", replayd.WithEventID("other"))
	// Not woken by the other hub's row, the poll would wait its 20 s.
	if p := answer(); len(p.Events) != 1 || string(p.Events[0].Data) != `"from the other hub"` {
		t.Fatalf("woken with %+v", p)
	}
}
