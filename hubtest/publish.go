package hubtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/wiretest"
)

// Publish, Subscribe and the log read through EventHub.Replay and
// EventLog.

func testPublishStoresAndReturnsEvent(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{DefaultType: "update"})
	ctx := context.Background()
	base := headOf(t, h)

	before := time.Now().Add(-time.Second)
	ev := mustPublish(t, h, "room-1", map[string]any{"n": 1})
	if ev.Sequence != base+1 || ev.Type != "update" || ev.Topic != "room-1" || string(ev.Payload) != `{"n":1}` {
		t.Fatalf("published %+v", ev)
	}
	if ev.CreatedAt.Before(before) || ev.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("CreatedAt %v is not now", ev.CreatedAt)
	}
	// A generated event id is a UUIDv7.
	if len(ev.EventID) != 36 || ev.EventID[14] != '7' {
		t.Fatalf("event id %q is not a UUIDv7", ev.EventID)
	}
	typed := mustPublish(t, h, "", json.RawMessage(`{"raw": true}`), replayd.WithType("alert"), replayd.WithEventID("evt-1"))
	if typed.Type != "alert" || typed.EventID != "evt-1" || typed.Topic != "" || string(typed.Payload) != `{"raw": true}` {
		t.Fatalf("published %+v", typed)
	}
	got, err := h.Replay(ctx, "", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].EventID != ev.EventID || got[1].Type != "alert" || string(got[1].Payload) != `{"raw": true}` || got[1].Topic != "" {
		t.Fatalf("replay = %+v", got)
	}
	if !got[0].CreatedAt.Equal(ev.CreatedAt) {
		t.Fatalf("stored CreatedAt %v, returned %v", got[0].CreatedAt, ev.CreatedAt)
	}
}

func testPublishRejectsBadInput(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := headOf(t, h)
	long := strings.Repeat("x", 257)
	cases := []struct {
		name    string
		topic   string
		payload any
		opts    []replayd.PublishOption
	}{
		{"topic too long", long, 1, nil},
		{"topic not utf8", "a\xffb", 1, nil},
		{"topic with newline", "a\nb", 1, nil},
		{"topic with DEL", "a\x7fb", 1, nil},
		{"topic with C1 control", "a\u0085b", 1, nil},
		{"topic with leading space", " a", 1, nil},
		{"topic with trailing tab", "a\t", 1, nil},
		{"empty type", "t", 1, []replayd.PublishOption{replayd.WithType("")}},
		{"type too long", "t", 1, []replayd.PublishOption{replayd.WithType(long)}},
		{"type with CR", "t", 1, []replayd.PublishOption{replayd.WithType("a\rb")}},
		{"type with LF", "t", 1, []replayd.PublishOption{replayd.WithType("a\nb")}},
		{"type with NUL", "t", 1, []replayd.PublishOption{replayd.WithType("a\x00b")}},
		{"empty id", "t", 1, []replayd.PublishOption{replayd.WithEventID("")}},
		{"id too long", "t", 1, []replayd.PublishOption{replayd.WithEventID(long)}},
		{"id with LF", "t", 1, []replayd.PublishOption{replayd.WithEventID("a\nb")}},
		{"unencodable payload", "t", func() {}, nil},
		{"raw invalid json", "t", json.RawMessage(`{"a":`), nil},
		{"bytes invalid json", "t", []byte(`nope`), nil},
		{"empty raw", "t", json.RawMessage(nil), nil},
		{"payload over 1 MiB", "t", strings.Repeat("x", 1<<20), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.Publish(context.Background(), tc.topic, tc.payload, tc.opts...)
			if !errors.Is(err, replayd.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for range 50 {
		if _, err := h.Publish(cancelled, "t", 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("publish with a done ctx: %v", err)
		}
	}
	head, err := h.LatestSequence(context.Background())
	if err != nil || head != base {
		t.Fatalf("head = %d, %v; want %d: nothing stored", head, err, base)
	}
	// The limits themselves are fine.
	mustPublish(t, h, strings.Repeat("t", 256), 1, replayd.WithType(strings.Repeat("y", 256)), replayd.WithEventID(strings.Repeat("i", 256)))
	mustPublish(t, h, "ünïcode topic", json.RawMessage(`"`+strings.Repeat("x", 1<<20-2)+`"`))
}

func testPublishIdempotentByEventID(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	seen := recordLive(t, h)
	first := mustPublish(t, h, "a", "first", replayd.WithEventID("same"))
	again := mustPublish(t, h, "b", "second", replayd.WithType("other"), replayd.WithEventID("same"))
	if again.Sequence != first.Sequence || string(again.Payload) != `"first"` || again.Topic != "a" || again.Type != "message" {
		t.Fatalf("republish returned %+v, want the original %+v", again, first)
	}
	next := mustPublish(t, h, "a", "next")
	evs, _ := h.Replay(context.Background(), "", 0, 10)
	if got := seqs(evs); !slices.Equal(got, []int64{first.Sequence, next.Sequence}) {
		t.Fatalf("stored %v", got)
	}
	if got := seen(); !slices.Equal(got, []int64{first.Sequence, next.Sequence}) {
		t.Fatalf("delivered %v; the duplicate must not be delivered", got)
	}
}

// Concurrent publishes with repeated ids in the same group-commit batch:
// exactly one row per id, every caller gets the same event for an id.
func testPublishIdempotentUnderConcurrency(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	const ids, copies = 20, 8
	results := make([][]replayd.Event, ids)
	for i := range results {
		results[i] = make([]replayd.Event, copies)
	}
	var wg sync.WaitGroup
	for i := range ids {
		for c := range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ev, err := h.Publish(context.Background(), "t", i, replayd.WithEventID(fmt.Sprint("id-", i)))
				if err != nil {
					t.Error(err)
				}
				results[i][c] = ev
			}()
		}
	}
	wg.Wait()
	for i, evs := range results {
		for _, ev := range evs {
			if ev.Sequence != evs[0].Sequence || ev.EventID != fmt.Sprint("id-", i) {
				t.Fatalf("id-%d: got %+v and %+v", i, ev, evs[0])
			}
		}
	}
	all, _ := h.Replay(context.Background(), "", 0, 1000)
	if len(all) != ids {
		t.Fatalf("%d rows stored, want %d", len(all), ids)
	}
}

// Many goroutines publishing: every subscriber sees strictly increasing
// sequences, each exactly once, and exactly the published set.
func testConcurrentPublishOrdering(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	seen := recordLive(t, h)
	const writers, each = 16, 50
	var (
		wg        sync.WaitGroup
		published = make(chan int64, writers*each)
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ev, err := h.Publish(context.Background(), fmt.Sprint("t", w%4), i)
				if err != nil {
					t.Error(err)
					return
				}
				published <- ev.Sequence
			}
		}()
	}
	wg.Wait()
	close(published)
	var want []int64
	for s := range published {
		want = append(want, s)
	}
	slices.Sort(want)
	if got := seen(); !slices.Equal(got, want) {
		t.Fatalf("subscriber saw %d events (sorted: %v), want %d", len(got), slices.IsSorted(got), len(want))
	}
}

func testSubscribeUnsubscribe(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	base := headOf(t, h)
	var got []int64
	var unsub func()
	unsub = h.Subscribe(func(ev replayd.Event) {
		got = append(got, ev.Sequence)
		if len(got) == 2 {
			unsub() // allowed from inside the callback
		}
	})
	for range 4 {
		mustPublish(t, h, "", 1)
	}
	unsub() // twice is fine
	if !slices.Equal(got, rel(base, 1, 2)) {
		t.Fatalf("got %v", got)
	}
}

func testReplayScopes(t *testing.T, newLog func(t *testing.T) opener) {
	open := newLog(t)
	h := open(replayd.Options{})
	ctx := context.Background()
	// Relative to b, the head: 1:a 2:b 3:bcast 4:a 5:b 6:a
	b := headOf(t, h)
	publishTopics(t, h, "a", "b", "", "a", "b", "a")
	l := h.Log()
	cases := []struct {
		topic string
		since int64
		limit int
		want  []int64
	}{
		{"a", 0, 10, rel(b, 1, 3, 4, 6)},
		{"b", b, 10, rel(b, 2, 3, 5)},
		{"", 0, 10, rel(b, 1, 2, 3, 4, 5, 6)},
		{"a", b + 1, 2, rel(b, 3, 4)},
		{"c", 0, 10, rel(b, 3)},
		{"", b + 6, 10, nil},
	}
	for _, tc := range cases {
		evs, err := l.Replay(ctx, tc.topic, tc.since, tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		if got := seqs(evs); !slices.Equal(got, tc.want) {
			t.Errorf("Replay(%q, %d, %d) = %v, want %v", tc.topic, tc.since, tc.limit, got, tc.want)
		}
	}
	latest, _ := l.ReplayLatest(ctx, "a", 0, 2)
	if got := seqs(latest); !slices.Equal(got, rel(b, 4, 6)) {
		t.Errorf("ReplayLatest(a, 0, 2) = %v", got)
	}
	latest, _ = l.ReplayLatest(ctx, "", b+2, 3)
	if got := seqs(latest); !slices.Equal(got, rel(b, 4, 5, 6)) {
		t.Errorf("ReplayLatest(\"\", 2, 3) = %v", got)
	}
	for _, tc := range []struct {
		topic         string
		after, before int64
		want          int64
	}{{"a", 0, b + 7, 4}, {"a", b + 1, b + 6, 2}, {"b", b, b + 3, 1}, {"", b + 1, b + 6, 4}, {"zzz", 0, b + 100, 1}} {
		n, err := l.CountBetween(ctx, tc.topic, tc.after, tc.before)
		if err != nil || n != tc.want {
			t.Errorf("CountBetween(%q, %d, %d) = %d, %v; want %d", tc.topic, tc.after, tc.before, n, err, tc.want)
		}
	}
	if _, err := l.Replay(ctx, "bad\ntopic", 0, 1); !errors.Is(err, replayd.ErrInvalid) {
		t.Errorf("Replay with a bad topic: %v", err)
	}
}

// recordLive subscribes to h until the test ends and returns a function
// that reports the sequences delivered so far.
func recordLive(t testing.TB, h *replayd.EventHub) func() []int64 {
	var seen wiretest.Seqs
	t.Cleanup(h.Subscribe(func(ev replayd.Event) { seen.Add(ev.Sequence) }))
	return seen.Seen
}

func seqs(evs []replayd.Event) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Sequence
	}
	return out
}
