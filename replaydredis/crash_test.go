package replaydredis

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/replaydredis/internal/redisserver"
	"github.com/replayd/replayd/storage"
)

// redis-server killed with SIGKILL while two stores append, under
// appendfsync everysec, and started again on its files. Whatever it lost
// (a kill -9 loses what the kernel had not been handed; an OS crash up to
// a second), every append that was acknowledged is either in the log as it
// was stored, or its sequence is foreign, through a store that lived
// across the crash and one opened after it; and nothing appended after the
// restart takes a sequence at or below one acknowledged before it.
func TestCrashEverysec(t *testing.T) {
	srv := redisserver.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	prefix := testPrefix(t)
	stores := []*Store{openStore(t, srv.URL(), prefix), openStore(t, srv.URL(), prefix)}
	var (
		mu    sync.Mutex
		acked []storage.Event
		wg    sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{}, len(stores))
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100000 && ctx.Err() == nil; j++ {
				id := fmt.Sprintf("s%d-%d", i, j)
				ev := storage.Event{EventID: id, Type: "message", Topic: []string{"", "a", "b"}[j%3], Payload: []byte(`"` + id + `"`)}
				actx, acancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := s.Append(actx, []storage.Event{ev})
				acancel()
				if err != nil {
					continue // Redis is down: nothing acknowledged
				}
				mu.Lock()
				acked = append(acked, res[0].Event)
				mu.Unlock()
				if j == 500 {
					started <- struct{}{}
				}
			}
		}()
	}
	for range stores {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the appenders did not get going within 30 s")
		}
	}
	srv.Kill()
	srv.Restart()
	cancel()
	wg.Wait()

	late := openStore(t, srv.URL(), prefix)
	var highest int64
	for _, e := range acked {
		highest = max(highest, e.Sequence)
	}
	for i, s := range append(stores, late) {
		next := mustAppend(t, s, fmt.Sprintf("after%d", i))[0]
		if next.Sequence <= highest {
			t.Fatalf("store %d appended %d after the restart, at or below the acknowledged %d", i, next.Sequence, highest)
		}
	}
	lost := 0
	for i, s := range []*Store{stores[0], late} {
		for _, e := range acked {
			p, err := s.Read(ctxT(t), storage.ReadRequest{After: e.Sequence - 1, Through: e.Sequence})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Events) == 1 {
				if got := p.Events[0]; got.EventID != e.EventID || string(got.Payload) != string(e.Payload) || got.Topic != e.Topic {
					t.Fatalf("store %d: sequence %d holds %+v, acknowledged as %+v", i, e.Sequence, got, e)
				}
				continue
			}
			w, err := s.Window(ctxT(t), nil, e.Sequence, 10)
			if err != nil {
				t.Fatal(err)
			}
			if !w.Foreign {
				t.Fatalf("store %d: the acknowledged %d is gone and its cursor is not foreign: a silent hole (%+v)", i, e.Sequence, w)
			}
			if i == 0 {
				lost++
			}
		}
	}
	t.Logf("%d appends acknowledged before the kill, %d of them lost (and foreign)", len(acked), lost)
}
