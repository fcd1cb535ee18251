package replaydredis

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
	"github.com/replayd/replayd/storage"
)

// hubOn opens a hub on s, closed when the test ends.
func hubOn(t testing.TB, s *Store) *replayd.EventHub {
	t.Helper()
	h, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// rawClient is a plain client of srv for what the test does from outside
// the store (SAVE, FLUSHALL).
func rawClient(t testing.TB, srv *redisserver.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// Log identity when Redis restarts from an older RDB snapshot
// (hubtest.CheckRestore, in place): the snapshot taken at the 5th event,
// redis-server killed at the 10th and started again on the snapshot,
// under the running hub, whose store reconnects. The restarted process has
// another run_id: the first connection raises the floor before any
// command, so the lost events' sequences are never issued again, and a
// client at the 10th gets unknown_cursor.
func TestRestartFromOlderRDB(t *testing.T) {
	srv := redisserver.Start(t)
	prefix := testPrefix(t)
	hubtest.CheckRestore(t, hubtest.Restore{
		Open: func() *replayd.EventHub { return hubOn(t, openStore(t, srv.URL(), prefix)) },
		Backup: func(h *replayd.EventHub) *replayd.EventHub {
			if err := rawClient(t, srv).Save(ctxT(t)).Err(); err != nil {
				t.Fatalf("SAVE: %v", err)
			}
			return h
		},
		Restore: func(h *replayd.EventHub) *replayd.EventHub {
			srv.Kill()
			srv.Restart()
			return h
		},
	})
}

// Log identity when Redis loses the tail of its append-only file (what
// appendfsync everysec loses to a kill -9, made exact here): every write
// fsynced (appendfsync always), the file's length noted at the 5th event,
// redis-server killed at the 10th, the file cut back to that length and
// redis-server started again on it, under the running hub.
func TestLostAOFTail(t *testing.T) {
	srv := redisserver.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	prefix := testPrefix(t)
	var incr string
	var size int64
	hubtest.CheckRestore(t, hubtest.Restore{
		Open: func() *replayd.EventHub { return hubOn(t, openStore(t, srv.URL(), prefix)) },
		Backup: func(h *replayd.EventHub) *replayd.EventHub {
			files, err := filepath.Glob(filepath.Join(srv.Dir, "appendonlydir", "*.incr.aof"))
			if err != nil || len(files) != 1 {
				t.Fatalf("the incremental AOF file: %v, %v", files, err)
			}
			fi, err := os.Stat(files[0])
			if err != nil {
				t.Fatal(err)
			}
			incr, size = files[0], fi.Size()
			return h
		},
		Restore: func(h *replayd.EventHub) *replayd.EventHub {
			srv.Kill()
			if err := os.Truncate(incr, size); err != nil {
				t.Fatal(err)
			}
			srv.Restart()
			return h
		},
	})
}

// A node that never saw the lost history: store B, opened before store A
// appended what the restart loses, appends first after Redis restarted
// from an older snapshot. B's own memory of the log (the highest sequence
// it knew issued) is below the lost sequences, so only the identity check
// keeps B from issuing them again; every one of them is foreign, through
// both stores.
func TestRestartOtherNodeReusesNothing(t *testing.T) {
	srv := redisserver.Start(t)
	prefix := testPrefix(t)
	a, b := openStore(t, srv.URL(), prefix), openStore(t, srv.URL(), prefix)
	kept := mustAppend(t, a, "k1", "k2")
	if err := rawClient(t, srv).Save(ctxT(t)).Err(); err != nil {
		t.Fatalf("SAVE: %v", err)
	}
	lost := mustAppend(t, a, "l1", "l2", "l3")
	srv.Kill()
	srv.Restart()

	fresh := mustAppend(t, b, "n1")
	for _, l := range lost {
		if fresh[0].Sequence <= l.Sequence {
			t.Fatalf("after the restart, node B appended %d, at or below the lost %d", fresh[0].Sequence, l.Sequence)
		}
	}
	for i, s := range []*Store{a, b} {
		for _, l := range lost {
			w, err := s.Window(ctxT(t), nil, l.Sequence, 10)
			if err != nil || !w.Foreign {
				t.Fatalf("store %d: Window at the lost %d: %+v, %v; want foreign", i, l.Sequence, w, err)
			}
		}
		// Below the snapshot point the two histories agree: no gap.
		p, err := s.Read(ctxT(t), storage.ReadRequest{After: kept[0].Sequence})
		if err != nil || p.Foreign || !slices.Equal(seqsOf(p.Events), []int64{kept[1].Sequence, fresh[0].Sequence}) {
			t.Fatalf("store %d: Read after %d: %+v, %v; want [%d %d]", i, kept[0].Sequence, p, err, kept[1].Sequence, fresh[0].Sequence)
		}
	}
}

// A log flushed under running stores (FLUSHALL, the same run_id): the
// head is gone, and the next append raises the floor above every sequence
// the appending store knew, so the flushed history's sequences are
// foreign and none is issued again.
func TestFlushedUnderRunningStore(t *testing.T) {
	srv := redisserver.Start(t)
	prefix := testPrefix(t)
	s := openStore(t, srv.URL(), prefix)
	old := mustAppend(t, s, "o1", "o2")
	if err := rawClient(t, srv).FlushAll(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
	next := mustAppend(t, s, "n1")
	if next[0].Sequence <= old[1].Sequence {
		t.Fatalf("after FLUSHALL: appended %d, at or below %d", next[0].Sequence, old[1].Sequence)
	}
	w, err := s.Window(ctxT(t), nil, old[1].Sequence, 10)
	if err != nil || !w.Foreign {
		t.Fatalf("Window at a flushed %d: %+v, %v; want foreign", old[1].Sequence, w, err)
	}
}

// mustAppend appends one broadcast per id and returns the stored events.
func mustAppend(t testing.TB, s *Store, ids ...string) []storage.Event {
	t.Helper()
	evs := make([]storage.Event, len(ids))
	for i, id := range ids {
		evs[i] = storage.Event{EventID: id, Type: "message", Payload: []byte(`"` + id + `"`)}
	}
	res, err := s.Append(ctxT(t), evs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	out := make([]storage.Event, len(res))
	for i, r := range res {
		if r.Err != nil || r.Duplicate {
			t.Fatalf("Append %s: %+v", ids[i], r)
		}
		out[i] = r.Event
	}
	return out
}

func seqsOf(evs []storage.Event) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Sequence
	}
	return out
}
