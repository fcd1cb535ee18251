package replayd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/storage"
)

// TestPollFromMemoryMatchesLog asks random polls twice, once as the hub
// answers them (from its poll window when it can) and once from the log,
// and wants the same bytes: random scopes (broadcasts included), cursors
// in and out of the window, inside a range the sequence floor skipped and
// above the head, limits, between publishes (batches with duplicates,
// payloads the encoder escapes), prunes the hub is not told of, publishes
// by another hub on the same file, and hub restarts.
func TestPollFromMemoryMatchesLog(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	db, path := openTestDB(t)
	var cur atomic.Pointer[EventHub]
	open := func() *EventHub {
		h := newTestHub(t, db, Options{Poll: PollOptions{MemoryEvents: 40, MemoryBytes: 4 << 10}})
		if rng.IntN(2) == 0 {
			// A subscriber: deliveries then read other processes' rows
			// into the window, across ranges their opens skipped.
			h.Subscribe(func(Event) {})
		}
		cur.Store(h)
		return h
	}
	h := open()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur.Load().PollHandler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var other *EventHub // another process on the same file, opened on first use

	ctx := context.Background()
	topics := []string{"a", "b", "c", ""}
	scopes := [][]string{nil, {"a"}, {"b"}, {"a", "b"}, {"c", "a"}, {"b", "c"}}
	var known []int64 // sequences published, ascending
	payload := func() any {
		switch rng.IntN(6) {
		case 4:
			// Raw, each what the encoder escapes or drops on its own.
			return []byte([]string{`{"s":"a<b"}`, `["&"]`, "\"\u2029\"", "\"\u2028\"", `[1, 2]`, "[1,\t2]", `{"a":"b"}`}[rng.IntN(7)])
		case 0:
			return map[string]any{"n": rng.IntN(1000), "s": "<&>\u2028"}
		case 1:
			return []byte(" [1, 2,\r\n 3] ")
		case 2:
			return bytes.Repeat([]byte("1"), rng.IntN(900)+1)
		default:
			return rng.IntN(100)
		}
	}
	get := func(q url.Values, fromLog bool) (int, []byte) {
		t.Helper()
		cur.Load().live.SetWindowOff(fromLog)
		defer cur.Load().live.SetWindowOff(false)
		resp, body := wiretest.Do(t, http.DefaultClient, http.MethodGet, srv.URL+"?"+q.Encode(), nil, wiretest.WaitFor)
		return resp.StatusCode, body
	}
	polls, pastHits := 0, 0
	hits := uint64(0)
	for step := range 2000 {
		switch r := rng.IntN(100); {
		case r < 30:
			n := rng.IntN(6) + 1
			evs := make([]Event, n)
			for i := range evs {
				p, err := encodePayload(payload())
				if err != nil {
					t.Fatal(err)
				}
				evs[i] = Event{Topic: topics[rng.IntN(len(topics))], Type: "t" + strconv.Itoa(rng.IntN(3)), Payload: p}
				if rng.IntN(4) == 0 {
					evs[i].EventID = "id" + strconv.Itoa(rng.IntN(50)) // some repeat: duplicates
				}
			}
			// Reads of the log before the publish, which the window must
			// still give for a probe made then, though it went on since.
			probe, err := h.store.Read(ctx, storage.ReadRequest{After: maxSequence, Limit: 1})
			if err != nil {
				t.Fatal(err)
			}
			var reqs []storage.ReadRequest
			var wants []storage.Page
			for range 3 {
				cursor := probe.Head
				if len(known) > 0 && rng.IntN(4) > 0 {
					cursor = known[max(0, len(known)-1-rng.IntN(min(len(known), 30)))]
				}
				req := storage.ReadRequest{Scope: scopes[rng.IntN(len(scopes))], After: cursor, Limit: rng.IntN(10) + 1, MaxBytes: 1 << 20}
				want, err := h.store.Read(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				reqs, wants = append(reqs, req), append(wants, want)
			}
			for _, res := range h.PublishBatch(ctx, evs) {
				if res.Err != nil {
					t.Fatal(res.Err)
				}
				if !res.Duplicate {
					known = append(known, res.Event.Sequence)
				}
			}
			for i, req := range reqs {
				got, ok := h.live.WindowAnswer(req, probe.Head, probe.Watermark)
				if !ok {
					continue
				}
				want := wants[i]
				if want.Watermark <= req.After {
					want.Watermark = 0
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("step %d, read %+v as of head %d:\nfrom memory: %+v\nfrom the log: %+v", step, req, probe.Head, got, want)
				}
				pastHits++
			}
		case r < 32:
			// Another process prunes: the hub is not told.
			if _, err := h.store.Prune(ctx, RetentionPolicy{MaxEvents: int64(rng.IntN(60) + 1)}); err != nil {
				t.Fatal(err)
			}
		case r < 34:
			// Another process publishes (its open may raise the floor).
			if other == nil {
				other = secondHub(t, path, Options{})
			}
			ev := mustPublish(t, other, topics[rng.IntN(len(topics))], rng.IntN(10))
			known = append(known, ev.Sequence)
		case r < 35:
			hits += h.metrics.pollMemory.Load()
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			if other != nil {
				other.Close()
				other = nil
			}
			h = open()
		default:
			polls++
			head, err := h.store.Head(ctx)
			if err != nil {
				t.Fatal(err)
			}
			q := url.Values{}
			for _, tp := range scopes[rng.IntN(len(scopes))] {
				q.Add("topic", tp)
			}
			var cursor int64
			switch c := rng.IntN(10); {
			case c < 4 && len(known) > 0: // a recent event
				cursor = known[max(0, len(known)-1-rng.IntN(min(len(known), 60)))]
			case c < 5 && len(known) > 0: // any event
				cursor = known[rng.IntN(len(known))]
			case c < 6:
				cursor = head
			case c < 7:
				cursor = head - int64(rng.IntN(100)) // not always an event: perhaps foreign
			case c < 8 && len(known) > 0: // just above an event: a spent or skipped sequence
				cursor = known[rng.IntN(len(known))] + 1
			case c < 9:
				cursor = head + int64(rng.IntN(3)) + 1 // above the head
			default:
				cursor = -1 // fresh
			}
			if cursor >= 0 {
				q.Set("cursor", strconv.FormatInt(cursor, 10))
			}
			if rng.IntN(4) > 0 {
				q.Set("limit", strconv.Itoa(rng.IntN(20)+1))
			}
			q.Set("wait", "0")
			mstatus, mem := get(q, false)
			lstatus, log := get(q, true)
			if mstatus != lstatus || !bytes.Equal(mem, log) {
				t.Fatalf("step %d, poll %s:\nfrom memory: %d %s\nfrom the log: %d %s", step, q.Encode(), mstatus, mem, lstatus, log)
			}
			// The window's page against the log's, with a byte bound the
			// handler's 4 MiB never reaches here.
			if cursor >= 0 {
				req := storage.ReadRequest{Scope: q["topic"], After: cursor, Limit: rng.IntN(20) + 1, MaxBytes: []int{rng.IntN(8) + 1, rng.IntN(3000) + 1}[rng.IntN(2)]}
				probe, err := h.store.Read(ctx, storage.ReadRequest{After: maxSequence, Limit: 1})
				if err != nil {
					t.Fatal(err)
				}
				if got, ok := h.live.WindowAnswer(req, probe.Head, probe.Watermark); ok {
					want, err := h.store.Read(ctx, req)
					if err != nil {
						t.Fatal(err)
					}
					if want.Watermark <= cursor {
						want.Watermark = 0 // not the window's to know, and not answered
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("step %d, read %+v:\nfrom memory: %+v\nfrom the log: %+v", step, req, got, want)
					}
				}
			}
		}
	}
	hits += h.metrics.pollMemory.Load()
	t.Logf("%d polls, %d answered from memory; %d reads answered as of an earlier probe", polls, hits, pastHits)
	if pastHits == 0 {
		t.Fatal("no read was answered as of an earlier probe")
	}
	if hits < uint64(polls)/4 {
		t.Fatalf("only %d of %d polls were answered from memory", hits, polls)
	}
}

// pollOnce polls the poll handler at url for topic after cursor and
// returns the answer's body.
func pollOnce(t *testing.T, url, topic string, cursor int64) []byte {
	t.Helper()
	_, body := wiretest.Do(t, http.DefaultClient, http.MethodGet, fmt.Sprintf("%s?topic=%s&cursor=%d", url, topic, cursor), nil, wiretest.WaitFor)
	return body
}

// TestPollFromMemoryNotWhenBehind: a poll is not answered from the window
// while rows another process committed are not in it.
func TestPollFromMemoryNotWhenBehind(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := httptest.NewServer(h.PollHandler())
	t.Cleanup(srv.Close)
	ev := mustPublish(t, h, "a", 1)
	other := secondHub(t, path, Options{})
	ev2 := mustPublish(t, other, "a", 2)
	body := pollOnce(t, srv.URL, "a", ev.Sequence)
	if want := fmt.Sprintf(`"id":%d`, ev2.Sequence); !bytes.Contains(body, []byte(want)) {
		t.Fatalf("answer %s lacks the other process's event %d", body, ev2.Sequence)
	}
	if n := h.metrics.pollMemory.Load(); n != 0 {
		t.Fatalf("%d polls answered from memory, want 0", n)
	}
}

// TestPollFromMemoryOff: with PollOptions.MemoryEvents negative, every
// poll reads the log, and gets the same answer; so does a fresh poll (no
// cursor), which with a window is answered from a probe of the head.
func TestPollFromMemoryOff(t *testing.T) {
	db, _ := openTestDB(t)
	for _, memory := range []int{-1, 0} {
		h := newTestHub(t, db, Options{Poll: PollOptions{MemoryEvents: memory}})
		srv := httptest.NewServer(h.PollHandler())
		first := mustPublish(t, h, "a", 1)
		last := mustPublish(t, h, "a", 2)
		body := pollOnce(t, srv.URL, "a", first.Sequence)
		_, fresh := wiretest.Do(t, http.DefaultClient, http.MethodGet, srv.URL+"?topic=a", nil, wiretest.WaitFor)
		srv.Close()
		if want := fmt.Sprintf(`"events":[{"id":%d,`, last.Sequence); !bytes.Contains(body, []byte(want)) {
			t.Fatalf("MemoryEvents %d: answer %s lacks event %d", memory, body, last.Sequence)
		}
		if want := fmt.Sprintf(`"cursor":%d`, last.Sequence); !bytes.Contains(fresh, []byte(want)) {
			t.Fatalf("MemoryEvents %d: fresh answer %s lacks cursor %d", memory, fresh, last.Sequence)
		}
		hits := h.metrics.pollMemory.Load()
		if memory < 0 && hits != 0 || memory == 0 && hits != 2 {
			t.Fatalf("MemoryEvents %d: %d polls answered from memory", memory, hits)
		}
		h.Close()
	}
}

// TestPollFromMemorySeesOwnPublish: a poll made after a publish returned
// answers that event, however many polls share probes meanwhile (a probe
// begun before the poll arrived never answers it).
func TestPollFromMemorySeesOwnPublish(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := httptest.NewServer(h.PollHandler())
	t.Cleanup(srv.Close)
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			errs <- func() error {
				topic := "g" + strconv.Itoa(g)
				prev, err := h.Publish(context.Background(), topic, 0)
				if err != nil {
					return err
				}
				for i := range 40 {
					ev, err := h.Publish(context.Background(), topic, i)
					if err != nil {
						return err
					}
					resp, err := http.Get(fmt.Sprintf("%s?topic=%s&cursor=%d", srv.URL, topic, prev.Sequence))
					if err != nil {
						return err
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil {
						return err
					}
					if want := fmt.Sprintf(`"events":[{"id":%d,`, ev.Sequence); !bytes.Contains(body, []byte(want)) {
						return fmt.Errorf("poll after publishing %d answered %s", ev.Sequence, body)
					}
					prev = ev
				}
				return nil
			}()
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if h.metrics.pollMemory.Load() == 0 {
		t.Fatal("no poll was answered from memory")
	}
}

// TestPollProbeStartedBeforeNotShared: a poll that arrives once a probe
// has started waits for the next one, which sees what was committed
// meanwhile.
func TestPollProbeStartedBeforeNotShared(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	srv := httptest.NewServer(h.PollHandler())
	t.Cleanup(srv.Close)
	ev0 := mustPublish(t, h, "a", 0)
	ev1 := mustPublish(t, h, "a", 1)
	reading, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) }) // before the cleanups wait for the polls
	first := true
	h.live.SetProbeHook(func() { // called by one probe at a time
		if first {
			first = false
			close(reading)
			<-release
		}
	})
	poll := func(cursor int64) <-chan string {
		out := make(chan string, 1)
		go func() {
			resp, err := http.Get(fmt.Sprintf("%s?topic=a&cursor=%d", srv.URL, cursor))
			if err != nil {
				out <- err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out <- string(body)
		}()
		return out
	}
	a := poll(ev0.Sequence)
	<-reading // a's probe has read the log, and has not answered
	ev2 := mustPublish(t, h, "a", 2)
	b := poll(ev1.Sequence)
	// b waits for a probe of its own.
	for deadline := time.Now().Add(waitFor); ; time.Sleep(time.Millisecond) {
		if h.live.ProbeWaiting() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second poll never waited for a probe")
		}
	}
	releaseOnce.Do(func() { close(release) })
	if got := <-a; !strings.Contains(got, fmt.Sprintf(`"events":[{"id":%d,`, ev1.Sequence)) {
		t.Fatalf("first poll: %s", got)
	}
	if got, want := <-b, fmt.Sprintf(`"events":[{"id":%d,`, ev2.Sequence); !strings.Contains(got, want) {
		t.Fatalf("second poll, after %d was published: %s", ev2.Sequence, got)
	}
	if n := h.metrics.pollMemory.Load(); n != 2 {
		t.Fatalf("%d polls answered from memory, want 2", n)
	}
}
