package replaydpg

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/sseparse"
	"github.com/replayd/replayd/storage"
)

// hexPayload is n bytes of random hex: text that PostgreSQL cannot
// compress, so a large one is stored out of line (TOAST).
func hexPayload(t testing.TB, n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}

// readOverhead bounds what one Read costs on the wire besides payloads:
// the pipeline's answers (head, watermark, BEGIN, COMMIT), the row
// descriptions, and each returned event's columns other than the payload.
const readOverhead = 4 << 10

// A Read whose page stops at MaxBytes receives from the server the payloads
// it returns and little more: not the payloads of the rows it fetched only
// to cut them (it used to fetch Limit+1 full rows and cut the page in Go,
// so paging through large events moved each one up to Limit times).
func TestReadReceivesOnlyThePage(t *testing.T) {
	t.Parallel()
	prefix := testPrefix(t)
	dsn, received := countingProxy(t, testDSN(t))
	s := openPrefixDSN(t, prefix, dsn)
	ctx := testCtx(t, 60*time.Second)
	// 30 events of 40 KiB over two topics and the broadcasts: a 64 KiB page
	// holds two of them.
	const n, size = 30, 40 << 10
	var evs []replayd.Event
	for i := range n {
		evs = append(evs, ev(fmt.Sprintf("big-%d", i), []string{"a", "b", ""}[i%3], hexPayload(t, size)))
	}
	mustAppend(t, s, evs...)
	for _, scope := range [][]string{nil, {"a"}} {
		var (
			after     int64
			got       []replayd.Event
			reads     int
			payload   int64
			wireBytes int64
		)
		for {
			before := received.Load()
			p, err := s.Read(ctx, storage.ReadRequest{Scope: scope, After: after, Limit: 64, MaxBytes: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			wireBytes += received.Load() - before
			reads++
			for _, e := range p.Events {
				payload += int64(len(e.Payload))
			}
			got = append(got, p.Events...)
			if p.More && len(p.Events) != 2 {
				t.Fatalf("scope %q after %d: %d events and More, want 2", scope, after, len(p.Events))
			}
			if !p.More {
				break
			}
			after = p.Events[len(p.Events)-1].Sequence
		}
		wantN := n
		if scope != nil {
			wantN = 2 * n / 3 // a and the broadcasts
		}
		if len(got) != wantN {
			t.Fatalf("scope %q: read %d events, want %d", scope, len(got), wantN)
		}
		bound := 2*payload + int64(reads)*readOverhead
		t.Logf("scope %q: %d reads returned %d payload bytes; the server sent %d bytes (bound %d)", scope, reads, payload, wireBytes, bound)
		if wireBytes > bound {
			t.Errorf("scope %q: %d reads returned %d payload bytes but received %d bytes from the server (%.1f×), bound %d",
				scope, reads, payload, wireBytes, float64(wireBytes)/float64(payload), bound)
		}
	}
}

// The same through a hub: replaying large events over SSE (pages of 64
// events or 64 KiB) receives from the server about what it replays.
func TestReplayReceivesOnlyThePages(t *testing.T) {
	t.Parallel()
	prefix := testPrefix(t)
	dsn, received := countingProxy(t, testDSN(t))
	s := openPrefixDSN(t, prefix, dsn)
	ctx := testCtx(t, 60*time.Second)
	hub, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()
	const n, size = 30, 40 << 10
	var payload int64
	for range n {
		ev, err := hub.Publish(ctx, "", hexPayload(t, size))
		if err != nil {
			t.Fatal(err)
		}
		payload += int64(len(ev.Payload))
	}
	before := received.Load()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	req.Header.Set("Last-Event-ID", "0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := sseparse.NewReaderSize(resp.Body, 64<<10)
	for got := 0; got < n; {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("after %d of %d events: %v", got, n, err)
		}
		if string(f.Event) == "message" {
			got++
		}
	}
	wireBytes := received.Load() - before
	// At most a read per event, and the window's read.
	bound := 2*payload + (n+1)*readOverhead
	t.Logf("replaying %d payload bytes received %d bytes from the server (bound %d)", payload, wireBytes, bound)
	if wireBytes > bound {
		t.Errorf("replaying %d payload bytes received %d bytes from the server (%.1f×), bound %d",
			payload, wireBytes, float64(wireBytes)/float64(payload), bound)
	}
}

// Read agrees with the whole log cut by hand, for random scopes, cursors,
// upper bounds, limits and byte bounds over payloads of random sizes:
// the page is the scope's events in (After, Through], at most Limit,
// stopping once they hold MaxBytes (at least one), and More is exact.
func TestReadPagesModel(t *testing.T) {
	t.Parallel()
	s, _ := openTestStore(t)
	ctx := testCtx(t, 60*time.Second)
	rng := mrand.New(mrand.NewPCG(11, 12))
	var evs []replayd.Event
	for i := range 120 {
		evs = append(evs, ev(fmt.Sprintf("m-%d", i), []string{"a", "b", "c", ""}[rng.IntN(4)], hexPayload(t, rng.IntN(3000))))
	}
	mustAppend(t, s, evs...)
	all := allEvents(t, s)
	head := all[len(all)-1].Sequence
	base := all[0].Sequence - 1 // the sequence floor: cursors are drawn above it
	inScope := func(scope []string, e replayd.Event) bool {
		if len(scope) == 0 || e.Topic == "" {
			return true
		}
		for _, topic := range scope {
			if topic == e.Topic {
				return true
			}
		}
		return false
	}
	for i := range 400 {
		var scope []string
		for _, topic := range []string{"a", "b", "c", "z"} {
			if rng.IntN(3) == 0 {
				scope = append(scope, topic)
			}
		}
		req := storage.ReadRequest{
			Scope:    scope,
			After:    base + rng.Int64N(head-base+2),
			Limit:    rng.IntN(12) - 1,
			MaxBytes: rng.IntN(12000) - 1000,
		}
		if rng.IntN(2) == 0 {
			req.Through = base + rng.Int64N(head-base+2)
		}
		if i%50 == 0 {
			req.MaxBytes = 1
		}
		through, limit := req.Through, req.Limit
		if through <= 0 {
			through = head + 1
		}
		if limit <= 0 {
			limit = 100
		}
		var want []int64
		more, size := false, 0
		for _, e := range all {
			if e.Sequence <= req.After || e.Sequence > through || !inScope(scope, e) {
				continue
			}
			if len(want) == limit || (req.MaxBytes > 0 && size >= req.MaxBytes) {
				more = true
				break
			}
			want = append(want, e.Sequence)
			size += len(e.Payload)
		}
		p, err := s.Read(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, e := range p.Events {
			got = append(got, e.Sequence)
			if string(e.Payload) != string(all[e.Sequence-base-1].Payload) {
				t.Fatalf("Read %+v: event %d has the wrong payload", req, e.Sequence)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || p.More != more || p.Head != head {
			t.Fatalf("Read %+v: %v More %v Head %d, want %v More %v Head %d", req, got, p.More, p.Head, want, more, head)
		}
	}
	// MaxBytes past what any sum of payloads reaches, and Through past
	// the head, are no bound.
	p, err := s.Read(ctx, storage.ReadRequest{Limit: 1000, MaxBytes: math.MaxInt, Through: 1<<63 - 1})
	if err != nil || len(p.Events) != len(all) || p.More {
		t.Fatalf("Read of everything: %d events, More %v, %v", len(p.Events), p.More, err)
	}
	if _, err := s.Read(ctx, storage.ReadRequest{Scope: []string{""}}); !errors.Is(err, replayd.ErrInvalid) {
		t.Fatalf("Read of an empty topic: %v, want ErrInvalid", err)
	}
}
