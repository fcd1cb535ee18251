package replayd

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/storage"
)

// The sweep of Durable Streams (internal/durable/sweep.go): a deleted or
// expired stream's events leave the log (PruneTopic) and its record and
// producers' state the tables, once nothing reads them; never what a fork
// still reads, nor what a stream created again at the path appended. The
// tests run rounds themselves, with the sweep's clock moved ahead where a
// stream must have expired; the hub's own loop sweeps besides, which the
// sweep is made for (any number may run at once).

// sweeper is a sweep of e's hub whose clock is ahead of the wall's.
func (e *dsEnv) sweeper(ahead time.Duration) *durable.Sweeper {
	return &durable.Sweeper{Store: e.h.store.(storage.StreamStore), Prune: e.h.durablePrune(),
		Now: func() time.Time { return time.Now().Add(ahead) }}
}

// sweep runs rounds of e.sweeper(ahead) until one lists less than a full
// batch, failing the test on an error, and returns the events pruned.
func (e *dsEnv) sweep(t testing.TB, ahead time.Duration) int64 {
	t.Helper()
	s := e.sweeper(ahead)
	var pruned int64
	for range 100 {
		listed, n, err := s.Round(t.Context(), durableSweepBatch)
		if err != nil {
			t.Fatalf("sweep: %v", err)
		}
		if pruned += n; listed < durableSweepBatch {
			return pruned
		}
	}
	t.Fatal("sweep: 100 full rounds")
	return 0
}

// rows counts topic's events in the log, and its stream records and
// producer states.
func (e *dsEnv) rows(t testing.TB, topic string) (events, records, producers int) {
	t.Helper()
	for _, c := range []struct {
		q string
		n *int
	}{
		{`SELECT count(*) FROM events WHERE topic = ?`, &events},
		{`SELECT count(*) FROM events_streams WHERE topic = ?`, &records},
		{`SELECT count(*) FROM events_stream_producers WHERE topic = ?`, &producers},
	} {
		if err := e.db.QueryRowContext(t.Context(), c.q, topic).Scan(c.n); err != nil {
			t.Fatal(err)
		}
	}
	return events, records, producers
}

// wantRows fails the test unless topic has that many events and records.
func (e *dsEnv) wantRows(t testing.TB, what, topic string, events, records int) {
	t.Helper()
	if ev, rec, _ := e.rows(t, topic); ev != events || rec != records {
		t.Fatalf("%s: %s has %d events and %d records, want %d and %d", what, topic, ev, rec, events, records)
	}
}

// wantNothingDue fails the test unless no record is due for the sweep.
func (e *dsEnv) wantNothingDue(t testing.TB, ahead time.Duration) {
	t.Helper()
	recs, err := e.h.store.(storage.StreamStore).DueStreams(t.Context(), time.Now().Add(ahead).UnixMilli(), 10)
	if err != nil || len(recs) != 0 {
		t.Fatalf("due after the sweep: %v, %v", recs, err)
	}
}

func (e *dsEnv) dsDelete(t testing.TB, name string) {
	t.Helper()
	if a := dsDo(t, http.MethodDelete, e.stream(name), nil, nil); a.status != http.StatusNoContent {
		t.Fatalf("DELETE %s: %v", name, a)
	}
}

// dsPut creates the stream name with the headers h (JSON unless they
// say), failing the test unless it answers 201.
func (e *dsEnv) dsPut(t testing.TB, name string, h http.Header) string {
	t.Helper()
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	a := dsDo(t, http.MethodPut, e.stream(name), h, nil)
	if a.status != http.StatusCreated {
		t.Fatalf("PUT %s %v: %v", name, h, a)
	}
	return a.header.Get("Stream-Next-Offset")
}

// A deleted stream's events (its messages and markers, through the
// ds.delete marker), record and producers' state are gone after a sweep;
// until then the stream is not found, and its events are still there.
func TestDurableSweepDeleted(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "s", "application/json")
	prod := http.Header{"Content-Type": {"application/json"}, "Producer-Id": {"p"}, "Producer-Epoch": {"0"}, "Producer-Seq": {"0"}}
	if a := dsDo(t, http.MethodPost, e.stream("s"), prod, []byte(`1`)); a.status != http.StatusOK {
		t.Fatalf("producer append: %v", a)
	}
	e.dsAppend(t, "s", "application/json", `2`)
	e.dsCreate(t, "other", "application/json")
	e.dsAppend(t, "other", "application/json", `"kept"`)
	if _, _, p := e.rows(t, "s"); p != 1 {
		t.Fatalf("%d producer states before the delete, want 1", p)
	}
	e.dsDelete(t, "s")
	if ev, _, p := e.rows(t, "s"); ev != 4 || p != 0 {
		t.Fatalf("after the delete, before a sweep: %d events (want 4: the markers and messages), %d producer states (want 0)", ev, p)
	}
	if a := dsDo(t, http.MethodHead, e.stream("s"), nil, nil); a.status != http.StatusNotFound {
		t.Fatalf("HEAD of a deleted stream: %v", a)
	}
	if n := e.sweep(t, 0); n > 4 {
		t.Fatalf("the sweep pruned %d events, more than the deleted stream's 4", n)
	}
	e.wantRows(t, "after a sweep", "s", 0, 0)
	e.wantRows(t, "another stream after a sweep", "other", 2, 1)
	e.wantNothingDue(t, 0)
	if a := e.dsRead(t, "other", "-1"); string(a.body) != `["kept"]` {
		t.Fatalf("the other stream: %s", a.body)
	}
	if a := dsDo(t, http.MethodGet, e.stream("s")+"?offset=-1", nil, nil); a.status != http.StatusNotFound {
		t.Fatalf("read of the swept stream: %v", a)
	}
}

// An expired stream (Stream-TTL, Stream-Expires-At) is buried and
// reclaimed by the first sweep after its expiry, not before; streams that
// have not expired keep everything.
func TestDurableSweepExpired(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsPut(t, "ttl", http.Header{"Stream-Ttl": {"60"}})
	at := time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)
	e.dsPut(t, "at", http.Header{"Stream-Expires-At": {at}})
	e.dsPut(t, "long", http.Header{"Stream-Ttl": {"3600"}})
	e.dsPut(t, "forever", http.Header{})
	for _, name := range []string{"ttl", "at", "long", "forever"} {
		e.dsAppend(t, name, "application/json", `1`)
		e.dsAppend(t, name, "application/json", `2`)
	}
	e.sweep(t, 0)
	for _, name := range []string{"ttl", "at", "long", "forever"} {
		e.wantRows(t, "a sweep before any expiry", name, 3, 1)
	}
	e.sweep(t, 2*time.Minute)
	for _, name := range []string{"ttl", "at"} {
		e.wantRows(t, "a sweep after the expiry", name, 0, 0)
		if a := dsDo(t, http.MethodHead, e.stream(name), nil, nil); a.status != http.StatusNotFound {
			t.Fatalf("HEAD of a swept stream: %v", a)
		}
	}
	for _, name := range []string{"long", "forever"} {
		e.wantRows(t, "a sweep before their expiry", name, 3, 1)
		if a := e.dsRead(t, name, "-1"); string(a.body) != "[1,2]" {
			t.Fatalf("%s after the sweep: %s", name, a.body)
		}
	}
	e.wantNothingDue(t, 2*time.Minute)
}

// A fork reads its deleted source's events until the fork goes: the sweep
// keeps them while it lives, and reclaims both once it is deleted.
func TestDurableSweepForkKeepsSource(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "p", "application/json")
	for _, m := range []string{`1`, `2`, `3`} {
		e.dsAppend(t, "p", "application/json", m)
	}
	e.dsPut(t, "f", http.Header{"Stream-Forked-From": {"/v1/stream/p"}})
	e.dsAppend(t, "f", "application/json", `4`)
	e.dsDelete(t, "p")
	e.sweep(t, 2*time.Minute)
	e.wantRows(t, "a deleted source while its fork lives", "p", 5, 1)
	if a := e.dsRead(t, "f", "-1"); string(a.body) != "[1,2,3,4]" {
		t.Fatalf("the fork after a sweep: %s", a.body)
	}
	e.dsDelete(t, "f")
	e.sweep(t, 0)
	e.wantRows(t, "the source after its last fork's deletion", "p", 0, 0)
	e.wantRows(t, "the deleted fork", "f", 0, 0)
	e.wantNothingDue(t, 0)
}

// A chain: g, its fork s, s's fork f, g and s deleted while f reads them,
// f expiring. Nothing is pruned while f lives; the sweep that buries f
// collects s and g, and reclaims all three.
func TestDurableSweepForkChainExpires(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "g", "application/json")
	e.dsAppend(t, "g", "application/json", `1`)
	e.dsPut(t, "s", http.Header{"Stream-Forked-From": {"/v1/stream/g"}})
	e.dsAppend(t, "s", "application/json", `2`)
	e.dsPut(t, "f", http.Header{"Stream-Forked-From": {"/v1/stream/s"}, "Stream-Ttl": {"60"}})
	e.dsAppend(t, "f", "application/json", `3`)
	e.dsDelete(t, "g") // it has s
	e.dsDelete(t, "s") // it has f
	e.sweep(t, 0)
	if a := e.dsRead(t, "f", "-1"); string(a.body) != "[1,2,3]" {
		t.Fatalf("the fork of deleted sources after a sweep: %s", a.body)
	}
	e.wantRows(t, "g while f lives", "g", 3, 1)
	e.wantRows(t, "s while f lives", "s", 3, 1)
	e.sweep(t, 2*time.Minute)
	for _, name := range []string{"g", "s", "f"} {
		e.wantRows(t, "after f expired and a sweep", name, 0, 0)
	}
	e.wantNothingDue(t, 2*time.Minute)
}

// A stream created again at a deleted stream's path, before the sweep
// came, keeps its own events: the sweep prunes only through the deleted
// incarnation's ds.delete marker. A reader holding an offset of the old
// one still gets 410 unknown_offset in every mode, never data.
func TestDurableSweepRecreated(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	oldBase := e.dsCreate(t, "s", "application/json")
	o1 := e.dsAppend(t, "s", "application/json", `"old-1"`)
	o2 := e.dsAppend(t, "s", "application/json", `"old-2"`)
	e.dsDelete(t, "s")
	e.dsCreate(t, "s", "application/json")
	e.dsAppend(t, "s", "application/json", `"new-1"`)
	e.sweep(t, 0)
	e.wantRows(t, "a stream created again, after a sweep", "s", 2, 1)
	e.wantNothingDue(t, 0)
	if a := e.dsRead(t, "s", "-1"); string(a.body) != `["new-1"]` {
		t.Fatalf("the new incarnation after a sweep: %s", a.body)
	}
	for _, off := range []string{oldBase, o1, o2} {
		e.readGone(t, "an earlier incarnation's offset after the sweep", "s", off, "unknown_offset")
	}
	e.dsAppend(t, "s", "application/json", `"new-2"`)
	if a := e.dsRead(t, "s", "-1"); string(a.body) != `["new-1","new-2"]` {
		t.Fatalf("the new incarnation, appended to after the sweep: %s", a.body)
	}
}

// The same over an expired stream the sweep has not buried yet: the PUT
// buries it first, and the sweep reclaims only the expired incarnation.
func TestDurableSweepRecreatedExpired(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	exp := time.Now().Add(300 * time.Millisecond)
	prod := http.Header{"Content-Type": {"application/json"}, "Producer-Id": {"p"}, "Producer-Epoch": {"0"}, "Producer-Seq": {"0"}}
	e.dsPut(t, "x", http.Header{"Stream-Expires-At": {exp.UTC().Format(time.RFC3339Nano)}})
	if a := dsDo(t, http.MethodPost, e.stream("x"), prod, []byte(`"old-1"`)); a.status != http.StatusOK {
		t.Fatalf("producer append: %v", a)
	}
	o1 := e.dsAppend(t, "x", "application/json", `"old-2"`)
	time.Sleep(time.Until(exp) + 10*time.Millisecond) // the wall clock must pass the expiry
	if a := dsDo(t, http.MethodHead, e.stream("x"), nil, nil); a.status != http.StatusNotFound {
		t.Fatalf("HEAD of an expired stream: %v", a)
	}
	e.dsCreate(t, "x", "application/json")
	if _, _, p := e.rows(t, "x"); p != 0 {
		t.Fatalf("%d producer states of the expired incarnation after the PUT, want 0", p)
	}
	// The same producer starts again on the new stream.
	if a := dsDo(t, http.MethodPost, e.stream("x"), prod, []byte(`"new-1"`)); a.status != http.StatusOK {
		t.Fatalf("producer append to the new stream: %v", a)
	}
	e.sweep(t, 0)
	e.wantRows(t, "a stream created over an expired one, after a sweep", "x", 2, 1)
	if a := e.dsRead(t, "x", "-1"); string(a.body) != `["new-1"]` {
		t.Fatalf("the new incarnation after a sweep: %s", a.body)
	}
	e.readGone(t, "the expired incarnation's offset after the sweep", "x", o1, "unknown_offset")
}

// Two sweeps at once (as two nodes sweep one PostgreSQL), over deleted
// and expiring streams and forks: every dead stream is reclaimed once,
// and a source one expiring fork released is kept for its other fork
// (its count of forks went down once, not twice).
func TestDurableSweepConcurrent(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	const n = 20
	for i := range n {
		name := "d" + strconv.Itoa(i)
		e.dsCreate(t, name, "application/json")
		e.dsAppend(t, name, "application/json", `1`)
		if i%2 == 0 {
			e.dsDelete(t, name)
		} else {
			e.dsPut(t, "x"+strconv.Itoa(i), http.Header{"Stream-Ttl": {"60"}})
		}
	}
	e.dsCreate(t, "p", "application/json")
	e.dsAppend(t, "p", "application/json", `1`)
	e.dsPut(t, "f1", http.Header{"Stream-Forked-From": {"/v1/stream/p"}, "Stream-Ttl": {"60"}})
	e.dsPut(t, "f2", http.Header{"Stream-Forked-From": {"/v1/stream/p"}})
	e.dsDelete(t, "p")
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			s := e.sweeper(2 * time.Minute)
			for {
				listed, _, err := s.Round(t.Context(), 3) // small rounds: the two interleave
				if err != nil || listed < 3 {
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
			t.Fatalf("a concurrent sweep: %v", err)
		}
	}
	for i := range n {
		if i%2 == 0 {
			e.wantRows(t, "a deleted stream", "d"+strconv.Itoa(i), 0, 0)
		} else {
			e.wantRows(t, "a stream that does not expire", "d"+strconv.Itoa(i), 2, 1)
			e.wantRows(t, "an expired stream", "x"+strconv.Itoa(i), 0, 0)
		}
	}
	e.wantRows(t, "an expired fork", "f1", 0, 0)
	e.wantRows(t, "a deleted source its other fork reads", "p", 3, 1)
	if a := e.dsRead(t, "f2", "-1"); string(a.body) != "[1]" {
		t.Fatalf("the other fork: %s", a.body)
	}
	e.dsDelete(t, "f2")
	e.sweep(t, 0)
	e.wantRows(t, "the source after its last fork", "p", 0, 0)
}

// The hub sweeps by itself from its first DurableStreams call: what a
// closed hub left to reclaim, the next hub on the file reclaims at once.
func TestDurableSweepRunsOnStart(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "s", "application/json")
	e.dsAppend(t, "s", "application/json", `1`)
	e.dsDelete(t, "s")
	if err := e.h.Close(); err != nil {
		t.Fatal(err)
	}
	e.wantRows(t, "a deleted stream, its hub closed", "s", 3, 1)
	h := newTestHub(t, e.db, Options{})
	srv := httptest.NewServer(h.DurableStreams(DurableStreamsOptions{Open: true}))
	t.Cleanup(srv.Close)
	deadline := time.Now().Add(waitFor)
	for {
		ev, rec, _ := e.rows(t, "s")
		if ev == 0 && rec == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new hub's sweep left %d events and %d records after %v", ev, rec, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
