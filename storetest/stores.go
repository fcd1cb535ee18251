package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// Two stores on one log, four appenders on each and a reader on a third
// store: the reader, reading above its cursor, never skips a row (sequence
// order is visibility order), and every store agrees on the head.
func testTwoStores(t *testing.T, open func() replayd.Store) {
	stores := []replayd.Store{open(), open()}
	reader := open()
	const perWriter, writers = 150, 4
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		appended []int64
		failed   = make(chan error, 2*writers)
	)
	done := make(chan struct{})
	for si, s := range stores {
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(si), uint64(w)))
				for i := 0; i < perWriter; {
					k := min(1+rng.IntN(4), perWriter-i)
					batch := make([]replayd.Event, k)
					for j := range batch {
						batch[j] = ev(fmt.Sprintf("s%dw%di%d", si, w, i+j), topics[rng.IntN(len(topics))], 8)
					}
					res, err := s.Append(context.Background(), batch)
					if err == nil && len(res) != k {
						err = fmt.Errorf("%d results for %d events", len(res), k)
					}
					if err != nil {
						failed <- err
						return
					}
					mu.Lock()
					for _, r := range res {
						appended = append(appended, r.Event.Sequence)
					}
					mu.Unlock()
					i += k
				}
			}()
		}
	}
	go func() { wg.Wait(); close(done) }()
	var (
		seen   []int64
		cursor int64
	)
	finished := false
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := reader.Read(ctxT(t), storage.ReadRequest{After: cursor, Limit: 64})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Events {
			if e.Sequence <= cursor {
				t.Fatalf("Read above %d returned %d", cursor, e.Sequence)
			}
			cursor = e.Sequence
			seen = append(seen, e.Sequence)
		}
		if p.Head < cursor {
			t.Fatalf("Head %d below an event read, %d", p.Head, cursor)
		}
		if finished && !p.More {
			break
		}
		select {
		case <-done:
			finished = true // one more pass reads the rest
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("appenders did not finish")
		}
	}
	select {
	case err := <-failed:
		t.Fatalf("Append: %v", err)
	default:
	}
	slices.Sort(appended)
	if len(appended) != 2*writers*perWriter {
		t.Fatalf("%d events appended", len(appended))
	}
	if !slices.Equal(seen, appended) {
		missing := 0
		for _, s := range appended {
			if _, ok := slices.BinarySearch(seen, s); !ok {
				missing++
			}
		}
		t.Fatalf("the reader skipped %d of %d rows: a row became visible below a sequence already read", missing, len(appended))
	}
	last := appended[len(appended)-1]
	for i, s := range append(stores, reader) {
		if h := head(t, s); h != last {
			t.Fatalf("store %d: head %d, want %d", i, h, last)
		}
	}
}

// The sequence floor (see replayd.Store): whoever opens a log raises its
// head to the clock in Unix microseconds and records the range skipped. A
// cursor strictly inside a skipped range, or above the head, is foreign,
// in Window and Read, through every store; 0, the head after each open and
// every sequence issued are not. Appends go on above the head.
func testSequenceFloor(t *testing.T, open func() replayd.Store) {
	before := time.Now().Add(-10 * time.Minute).UnixMicro() // a backend's clock may differ a little from ours
	s := open()
	h1 := head(t, s)
	if h1 < before {
		t.Fatalf("head of a log once opened: %d, want the clock in microseconds (about %d)", h1, time.Now().UnixMicro())
	}
	evs := appendAll(t, s, ev("f1", "a", 5), ev("f2", "", 5), ev("f3", "b", 5))
	h2 := head(t, s)
	if evs[0].Sequence <= h1 || h2 != evs[2].Sequence {
		t.Fatalf("appended %v after the head %d; head now %d", seqs(evs), h1, h2)
	}
	// Opening the log again raises the head again, past the last append.
	s2 := open()
	h3 := head(t, s2)
	if h3 <= h2+1 || head(t, s) != h3 {
		t.Fatalf("head after another open: %d (and %d through the first store), want above %d", h3, head(t, s), h2+1)
	}
	check := func(cursor int64, foreign bool) {
		t.Helper()
		for i, st := range []replayd.Store{s, s2} {
			for _, scope := range [][]string{nil, {"a"}} {
				w, err := st.Window(ctxT(t), scope, cursor, 10)
				if err != nil {
					t.Fatal(err)
				}
				p := read(t, st, storage.ReadRequest{Scope: scope, After: cursor})
				if w.Foreign != foreign || p.Foreign != foreign {
					t.Fatalf("store %d, scope %v, cursor %d (floors %d, %d; events %v): Window Foreign %v, Read Foreign %v; want %v",
						i, scope, cursor, h1, h3, seqs(evs), w.Foreign, p.Foreign, foreign)
				}
				if foreign && len(p.Events) != 0 && cursor > w.Head {
					t.Fatalf("cursor %d above the head: Read returned %v", cursor, seqs(p.Events))
				}
			}
		}
	}
	for _, c := range []int64{0, h1, evs[0].Sequence, evs[1].Sequence, h2, h3} {
		check(c, false)
	}
	for _, c := range []int64{1, h1 - 1, h2 + 1, (h2 + h3) / 2, h3 - 1, h3 + 1, h3 + 1000} {
		check(c, true)
	}
	// Appends go on above the new head; a cursor at the old head reads them.
	next := appendAll(t, s, ev("f4", "a", 5))[0]
	if next.Sequence <= h3 {
		t.Fatalf("sequence %d after the raised head %d", next.Sequence, h3)
	}
	check(h3-1, true)
	check(next.Sequence, false)
	if p := read(t, s2, storage.ReadRequest{After: h2}); p.Foreign || !slices.Equal(seqs(p.Events), []int64{next.Sequence}) {
		t.Fatalf("Read after %d: %v, Foreign %v; want [%d]", h2, seqs(p.Events), p.Foreign, next.Sequence)
	}
	w, err := s2.Window(ctxT(t), nil, h2, 10)
	if err != nil || w.Foreign || w.From <= h2 || w.From > next.Sequence || w.Head != next.Sequence {
		t.Fatalf("Window from %d: %+v, %v; want the window [%d]", h2, w, err, next.Sequence)
	}
}
