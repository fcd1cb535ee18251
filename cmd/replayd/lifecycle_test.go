package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// The operational endpoints.
func TestEndpoints(t *testing.T) {
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "e.db"))...)
	publish(t, d.base, "room-1", "m1", 1)
	for _, tc := range []struct{ path, ctype, body string }{
		{"/healthz", "text/plain", "ok"},
		{"/readyz", "text/plain", "ok"},
		{"/replayd.js", "text/javascript", "export function subscribe"},
		{"/metrics", "text/plain", "replayd_events_published_total 1"},
		{"/metrics", "text/plain", "go_goroutines"},
		{"/metrics", "text/plain", "process_resident_memory_bytes"},
	} {
		status, body := wiretest.Get(t, d.base+tc.path, nil)
		resp, err := http.Get(d.base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if status != 200 || !strings.Contains(body, tc.body) || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.ctype) {
			t.Errorf("GET %s: %d %s %.100q, want %s holding %q", tc.path, status, resp.Header.Get("Content-Type"), body, tc.ctype, tc.body)
		}
	}
	if strings.Contains(d.logs.String(), publishKey) || strings.Contains(d.logs.String(), testSecret) {
		t.Errorf("a key is in the logs:\n%s", d.logs.String())
	}
}

// A restart on the same SQLite file: clients resume exactly where they
// were, and sequences go on from the old head.
func TestRestartResumesExactly(t *testing.T) {
	db := filepath.Join(t.TempDir(), "restart.db")
	args := serveArgs(t, db)
	d := start(t, nil, args...)
	tok := token(t, farFuture(), "room-*")
	var seqs []int64
	for i := range 5 {
		seqs = append(seqs, publish(t, d.base, "room-1", fmt.Sprint("a", i), i).Sequence)
	}
	c := wiretest.Dial(t, d.base+"/events?topic=room-1&access_token="+tok, wiretest.LastID(0))
	c.Hello()
	c.NextIs(seqs[0], "replay")
	c.NextIs(seqs[1], "replay")
	c.NextIs(seqs[2], "replay")
	c.Close()
	d.stop(t, syscall.SIGTERM)

	d = start(t, nil, args...)
	for i := range 3 {
		seqs = append(seqs, publish(t, d.base, "room-1", fmt.Sprint("b", i), i).Sequence)
	}
	if seqs[5] <= seqs[4] {
		t.Fatalf("sequence after the restart %d, before %d", seqs[5], seqs[4])
	}
	// A repeated id from before the restart is still a duplicate.
	if a := publish(t, d.base, "room-1", "a0", 0); !a.Duplicate || a.Sequence != seqs[0] {
		t.Errorf("an id from before the restart: %+v", a)
	}
	c = wiretest.Dial(t, d.base+"/events?topic=room-1&access_token="+tok, wiretest.LastID(seqs[2]))
	c.Hello()
	for _, s := range seqs[3:] {
		c.NextIs(s, "resumed after the restart")
	}
	c.Quiet(200 * time.Millisecond)
	p := wiretest.Poll(t, d.base, "topic=room-1&access_token="+tok+"&cursor="+strconv.FormatInt(seqs[2], 10))
	if fmt.Sprint(p.IDs()) != fmt.Sprint(seqs[3:]) || p.Gap != nil {
		t.Errorf("poll after the restart: %v gap %+v, want %v", p.IDs(), p.Gap, seqs[3:])
	}
}

// SIGTERM while clients stream and publishers publish: the process exits 0
// within 10s, every stream ends, every acknowledged publish is stored once,
// and every client resumes on a new process with nothing lost.
func TestSIGTERMDrains(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { testSIGTERMDrains(t, mode.args) })
	}
}

func testSIGTERMDrains(t *testing.T, extra []string) {
	const clients, publishers = 200, 8
	db := filepath.Join(t.TempDir(), "drain.db")
	args := append(serveArgs(t, db), extra...)
	d := start(t, nil, args...)
	tok := token(t, farFuture(), "room-*")
	streams := make([]*wiretest.Client, clients)
	for i := range streams {
		streams[i] = wiretest.Dial(t, d.base+"/events?topic=room-1&access_token="+tok, wiretest.LastID(0))
		streams[i].Hello()
	}
	// Each client records the ids it saw until its stream ends.
	last := make([]int64, clients)
	var readers sync.WaitGroup
	for i, c := range streams {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				f, err := c.NextErr(2 * waitFor)
				if err != nil {
					return
				}
				if f.Event == "message" || f.Event == "" {
					id, _ := strconv.ParseInt(f.ID, 10, 64)
					if id <= last[i] {
						t.Errorf("client %d: id %d after %d", i, id, last[i])
					}
					last[i] = id
				}
			}
		}()
	}
	type ack struct {
		id  string
		seq int64
	}
	var (
		mu    sync.Mutex // guards acked
		acked []ack
	)
	stopPub := make(chan struct{})
	var pubs sync.WaitGroup
	client := &http.Client{Timeout: waitFor}
	for p := range publishers {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			for n := 0; ; n++ {
				select {
				case <-stopPub:
					return
				default:
				}
				id := fmt.Sprintf("p%d-%d", p, n)
				body := fmt.Sprintf(`{"topic":"room-1","id":%q,"data":%q}`, id, id)
				req, _ := http.NewRequest(http.MethodPost, d.base+"/publish", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+publishKey)
				resp, err := client.Do(req)
				if err != nil {
					return // the server is gone
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					continue // refused while shutting down: not acknowledged
				}
				var a publishAnswer
				if err := json.Unmarshal(b, &a); err != nil {
					t.Errorf("answer %s: %v", b, err)
					return
				}
				mu.Lock()
				acked = append(acked, ack{id, a.Sequence})
				mu.Unlock()
			}
		}()
	}
	wiretest.WaitUntil(t, "100 acknowledged publishes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 100
	})
	took := d.stop(t, syscall.SIGTERM)
	close(stopPub)
	pubs.Wait()
	readers.Wait() // every stream ended (each NextErr is bounded)
	if took > 10*time.Second {
		t.Errorf("exit took %v", took)
	}
	t.Logf("SIGTERM to exit: %v; %d publishes acknowledged", took, len(acked))

	d = start(t, nil, args...)
	p := wiretest.Poll(t, d.base, "cursor=0&limit=100000&access_token="+token(t, farFuture(), "*"))
	if p.More || p.Gap != nil {
		t.Fatalf("poll: more %v gap %+v", p.More, p.Gap)
	}
	stored := map[string]int64{} // event id (the data) -> sequence
	for _, e := range p.Events {
		var id string
		json.Unmarshal(e.Data, &id)
		if _, dup := stored[id]; dup {
			t.Errorf("%s stored twice", id)
		}
		stored[id] = e.ID
	}
	for _, a := range acked {
		if seq, ok := stored[a.id]; !ok || seq != a.seq {
			t.Errorf("acknowledged %s (sequence %d): stored as %d, %v", a.id, a.seq, seq, ok)
		}
	}
	// Every client resumes from its last id and gets exactly the rest. The
	// head is the restarted log's: opening it raised its sequence floor
	// above the last event (docs/restore.md).
	head := p.Head
	if head <= p.Cursor {
		t.Errorf("head %d after the restart, want above the last event %d (the floor raised on open)", head, p.Cursor)
	}
	for i := range clients {
		var want []int64
		for _, e := range p.Events {
			if e.ID > last[i] {
				want = append(want, e.ID)
			}
		}
		if len(want) > 100 { // over the replay limit: the poll covers it
			continue
		}
		c := wiretest.Dial(t, d.base+"/events?topic=room-1&access_token="+tok, wiretest.LastID(last[i]))
		_, _, cursor, h := c.Hello()
		if cursor != last[i] || h != head {
			t.Errorf("client %d: hello cursor %d head %d, want %d %d", i, cursor, h, last[i], head)
		}
		for _, s := range want {
			c.NextIs(s, fmt.Sprintf("client %d resuming", i))
		}
		c.Close()
	}
}
