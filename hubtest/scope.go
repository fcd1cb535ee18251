package hubtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Connections with a scope of several topics: the hello's shape, replay
// and gaps counted over the union, and live delivery once per event.

// helloData is a hello frame's data with every key kept.
type helloData struct {
	Topic  *string          `json:"topic"`
	Topics *json.RawMessage `json:"topics"`
	Cursor int64            `json:"cursor"`
	Head   int64            `json:"head"`
}

func readHello(t *testing.T, c *wiretest.Client) helloData {
	t.Helper()
	f := c.NextNonHeartbeat()
	if f.Event != "hello" {
		t.Fatalf("first frame %+v, want hello", f)
	}
	var d helloData
	if err := json.Unmarshal([]byte(f.Data), &d); err != nil || d.Topics == nil {
		t.Fatalf("hello %q: %v", f.Data, err)
	}
	return d
}

func testScopeHelloShape(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	srv := serve(t, h)
	for _, c := range []struct {
		query, topics string
		topic         *string
	}{
		{"", `[]`, nil},
		{"?topic=a", `["a"]`, ptr("a")},
		{"?topic=b&topic=a&topic=b", `["b","a"]`, nil},
	} {
		d := readHello(t, wiretest.Dial(t, srv.URL+c.query, nil))
		if string(*d.Topics) != c.topics {
			t.Errorf("%s: topics %s, want %s", c.query, *d.Topics, c.topics)
		}
		if (d.Topic == nil) != (c.topic == nil) || (d.Topic != nil && *d.Topic != *c.topic) {
			t.Errorf("%s: topic %v, want %v", c.query, d.Topic, c.topic)
		}
	}
}

// publishMix publishes n events cycling over a, b, c and broadcasts and
// returns them.
func publishMix(t *testing.T, h *replayd.EventHub, n int) []replayd.Event {
	var evs []replayd.Event
	for i := range n {
		evs = append(evs, mustPublish(t, h, []string{"a", "b", "c", ""}[i%4], i))
	}
	return evs
}

// inScope returns the events of evs visible to topics above after.
func inScope(evs []replayd.Event, after int64, topics ...string) []replayd.Event {
	var out []replayd.Event
	for _, ev := range evs {
		if ev.Sequence <= after {
			continue
		}
		visible := ev.Topic == ""
		for _, t := range topics {
			visible = visible || ev.Topic == t
		}
		if visible {
			out = append(out, ev)
		}
	}
	return out
}

func testScopeUnionReplayExactCounts(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	const limit = 7
	h := open(replayd.Options{SSE: replayd.SSEOptions{ReplayLimit: limit}})
	base := headOf(t, h)
	evs := publishMix(t, h, 60)
	srv := serve(t, h)
	for _, cursor := range []int64{0, base + 13, base + 41, base + 55} {
		c := wiretest.Dial(t, srv.URL+"?topic=c&topic=a", http.Header{"Last-Event-ID": {strconv.FormatInt(cursor, 10)}})
		readHello(t, c)
		want := inScope(evs, cursor, "a", "c")
		if len(want) > limit {
			g := wiretest.MustGap(t, c.Next())
			skipped := want[:len(want)-limit]
			if g.Reason != "replay_limit" || *g.Missed != int64(len(skipped)) ||
				*g.MissedFrom != skipped[0].Sequence || *g.MissedThrough != skipped[len(skipped)-1].Sequence {
				t.Fatalf("cursor %d: gap %+v, want %d missed in [%d, %d]", cursor, g, len(skipped), skipped[0].Sequence, skipped[len(skipped)-1].Sequence)
			}
			want = want[len(want)-limit:]
		}
		for _, ev := range want {
			if f := c.Next(); f.ID != fmt.Sprint(ev.Sequence) {
				t.Fatalf("cursor %d: replayed %+v, want %d", cursor, f, ev.Sequence)
			}
		}
		c.Close()
	}
}

// A pruned watermark on any one topic of the scope (here b, with a and the
// broadcasts untouched above the cursor) makes the gap "pruned".
func testScopePrunedWatermarkOfOneTopic(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	a1 := mustPublish(t, h, "x", 1)
	b2 := mustPublish(t, h, "b", 2)
	evs := publishMix(t, h, 8) // 3..10
	if n, err := h.Prune(context.Background(), replayd.RetentionPolicy{MaxEvents: 8}); err != nil || n != 2 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	srv := serve(t, h)
	// Scope {a, b}, cursor 1: b's row 2 is gone.
	c := wiretest.Dial(t, srv.URL+"?topic=a&topic=b", http.Header{"Last-Event-ID": {fmt.Sprint(a1.Sequence)}})
	readHello(t, c)
	g := wiretest.MustGap(t, c.Next())
	if g.Reason != "pruned" || *g.MissedFrom != a1.Sequence+1 || *g.MissedThrough != b2.Sequence || g.Missed != nil {
		t.Fatalf("gap %+v, want pruned [%d, %d]", g, a1.Sequence+1, b2.Sequence)
	}
	for _, ev := range inScope(evs, 0, "a", "b") {
		c.NextIs(ev.Sequence, "replayed")
	}
	// Scope {a, c}: nothing of it was pruned above the cursor, no gap.
	c2 := wiretest.Dial(t, srv.URL+"?topic=a&topic=c", wiretest.LastID(a1.Sequence))
	readHello(t, c2)
	for _, ev := range inScope(evs, 0, "a", "c") {
		c2.NextIs(ev.Sequence, "replayed")
	}
}

// A connection whose topics overlap an event several times (a broadcast
// meets each of its subscriptions) gets it once, in order; heartbeats get
// "" for a scope of several topics.
func testScopeOverlapDeliveredOnce(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	hbTopics := make(chan string, 100)
	h := open(replayd.Options{SSE: replayd.SSEOptions{
		HeartbeatInterval: 50 * time.Millisecond,
		HeartbeatData:     func(topic string) any { hbTopics <- topic; return nil },
	}})
	srv := serve(t, h)
	c := wiretest.Dial(t, srv.URL+"?topic=a&topic=b&topic=c", nil)
	readHello(t, c)
	single := wiretest.Dial(t, srv.URL+"?topic=b", nil)
	readHello(t, single)
	var want []string
	for i := range 20 {
		topic := []string{"", "a", "b", "d", ""}[i%5]
		ev := mustPublish(t, h, topic, i)
		if topic != "d" {
			want = append(want, fmt.Sprint(ev.Sequence))
		}
	}
	last := mustPublish(t, h, "c", "last")
	want = append(want, fmt.Sprint(last.Sequence))
	for _, id := range want {
		if f := c.NextNonHeartbeat(); f.ID != id {
			t.Fatalf("got %+v, want id %s", f, id)
		}
	}
	c.Quiet(200 * time.Millisecond)
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case tp := <-hbTopics:
			seen[tp] = true
		case <-time.After(waitFor):
			t.Fatalf("heartbeat topics seen: %v", seen)
		}
	}
	if !seen[""] || !seen["b"] {
		t.Fatalf("heartbeat topics %v, want \"\" and \"b\"", seen)
	}
}

func ptr[T any](v T) *T { return &v }
