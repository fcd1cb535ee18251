package hubtest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/storage"
)

// SweepStore is a store the Durable Streams sweep runs over: a
// storage.StreamStore that prunes a topic (storage.TopicPruner).
type SweepStore interface {
	replayd.Store
	storage.StreamStore
	storage.TopicPruner
}

// Sweep describes two stores of one log for CheckSweep.
type Sweep struct {
	// Stores are two stores on one new log, as two nodes' would be.
	Stores [2]SweepStore
	// Rows counts what the log holds of topic: its retained events, and
	// its stream records (0 or 1), read from the backend directly.
	Rows func(ctx context.Context, topic string) (events, records int, err error)
}

// CheckSweep checks the Durable Streams sweep (internal/durable's
// Sweeper, which the hub runs) on two nodes of one log: streams are
// created on one node and deleted on the other, then both nodes sweep at
// once, with their clocks ahead of every TTL. Every dead stream's events
// and records are gone, exactly once; what a live fork reads and what a
// stream created again appended are kept; an offset of a swept
// incarnation is 410 unknown_offset.
func CheckSweep(t *testing.T, in Sweep) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := func(s replayd.Store) string {
		h, err := replayd.NewWithStore(s, replayd.Options{})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h.DurableStreams(replayd.DurableStreamsOptions{Open: true}))
		t.Cleanup(func() {
			srv.Close()
			h.Close()
		})
		return srv.URL + "/v1/stream/"
	}
	a, b := in.Stores[0], in.Stores[1]
	urlA, urlB := node(a), node(b)
	do := func(method, u string, hd http.Header, body string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = hd
		if req.Header == nil {
			req.Header = http.Header{}
		}
		if req.Header.Get("Content-Type") == "" && method != http.MethodGet && method != http.MethodDelete {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		rb, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header, string(rb)
	}
	want := func(what string, status, want int, body string) {
		t.Helper()
		if status != want {
			t.Fatalf("%s: %d %s, want %d", what, status, body, want)
		}
	}
	put := func(u, name string, hd http.Header) {
		t.Helper()
		st, _, body := do(http.MethodPut, u+name, hd, "")
		want("PUT "+name, st, http.StatusCreated, body)
	}
	post := func(u, name, msg string) string {
		t.Helper()
		st, h, body := do(http.MethodPost, u+name, nil, msg)
		want("POST "+name, st, http.StatusNoContent, body)
		return h.Get("Stream-Next-Offset")
	}
	del := func(u, name string) {
		t.Helper()
		st, _, body := do(http.MethodDelete, u+name, nil, "")
		want("DELETE "+name, st, http.StatusNoContent, body)
	}
	read := func(u, name, offset string) (int, string) {
		st, _, body := do(http.MethodGet, u+name+"?offset="+offset, nil, "")
		return st, body
	}
	rows := func(topic string) (events, records int) {
		t.Helper()
		events, records, err := in.Rows(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		return events, records
	}
	wantRows := func(what, topic string, events, records int) {
		t.Helper()
		if ev, rec := rows(topic); ev != events || rec != records {
			t.Fatalf("%s: %s has %d events and %d records, want %d and %d", what, topic, ev, rec, events, records)
		}
	}

	const n = 12
	for i := range n {
		name := "s" + strconv.Itoa(i)
		hd := http.Header{}
		if i%3 == 1 {
			hd.Set("Stream-Ttl", "60")
		}
		put(urlA, name, hd)
		post(urlB, name, `1`)
		if i%3 == 0 {
			del(urlB, name)
		}
	}
	// A deleted source its fork reads, and one an expiring fork released.
	put(urlA, "p", nil)
	post(urlA, "p", `"p"`)
	put(urlB, "keep", http.Header{"Stream-Forked-From": {"/v1/stream/p"}})
	put(urlA, "gone", http.Header{"Stream-Forked-From": {"/v1/stream/p"}, "Stream-Ttl": {"60"}})
	del(urlB, "p")
	// Deleted and created again, on the other node.
	put(urlA, "r", nil)
	old := post(urlA, "r", `"old"`)
	del(urlB, "r")
	put(urlB, "r", nil)
	post(urlA, "r", `"new"`)

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, s := range []SweepStore{a, b} {
		sw := &durable.Sweeper{Store: s, Prune: s.PruneTopic, Now: func() time.Time { return time.Now().Add(2 * time.Minute) }}
		wg.Go(func() {
			for {
				listed, _, err := sw.Round(ctx, 4)
				if err != nil || listed < 4 {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a node's sweep: %v", err)
		}
	}
	for i := range n {
		name := "s" + strconv.Itoa(i)
		if i%3 == 2 {
			wantRows("a live stream", name, 2, 1)
		} else {
			wantRows("a deleted or expired stream", name, 0, 0)
		}
	}
	wantRows("an expired fork", "gone", 0, 0)
	wantRows("a deleted source a live fork reads", "p", 3, 1)
	if st, body := read(urlB, "keep", "-1"); st != http.StatusOK || body != `["p"]` {
		t.Fatalf("the live fork: %d %s", st, body)
	}
	wantRows("a stream created again", "r", 2, 1)
	if st, body := read(urlA, "r", "-1"); st != http.StatusOK || body != `["new"]` {
		t.Fatalf("the stream created again: %d %s", st, body)
	}
	st, _, body := do(http.MethodGet, urlB+"r?offset="+old, nil, "")
	var gone struct{ Code string }
	if st != http.StatusGone || json.Unmarshal([]byte(body), &gone) != nil || gone.Code != "unknown_offset" {
		t.Fatalf("an offset of the swept incarnation: %d %s, want 410 unknown_offset", st, body)
	}
	recs, err := a.DueStreams(ctx, time.Now().Add(2*time.Minute).UnixMilli(), 10)
	if err != nil || len(recs) != 0 {
		t.Fatalf("due after both sweeps: %v, %v", recs, err)
	}
	// The last fork goes: its source is reclaimed by the next sweep.
	del(urlA, "keep")
	sw := &durable.Sweeper{Store: b, Prune: b.PruneTopic, Now: time.Now}
	if _, _, err := sw.Round(ctx, 10); err != nil {
		t.Fatal(err)
	}
	wantRows("the source after its last fork", "p", 0, 0)
	wantRows("the last fork", "keep", 0, 0)
}
