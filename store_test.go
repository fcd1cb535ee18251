package replayd

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// bus wakes every notifyingStore sharing it when one of them appends: an
// in-process stand-in for PostgreSQL's LISTEN/NOTIFY.
type bus struct {
	mu   sync.Mutex
	head int64
	ch   chan struct{}
}

func newBus() *bus { return &bus{ch: make(chan struct{})} }

func (b *bus) notify(head int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if head > b.head {
		b.head = head
		close(b.ch)
		b.ch = make(chan struct{})
	}
}

// notifyingStore is a Store that is also a Notifier, through a bus.
type notifyingStore struct {
	Store
	bus   *bus
	waits chan struct{} // a receive per WaitForAppend call, if not nil
}

func (s *notifyingStore) Append(ctx context.Context, evs []Event) ([]AppendResult, error) {
	res, err := s.Store.Append(ctx, evs)
	if err == nil {
		if head, herr := s.Store.Head(ctx); herr == nil {
			s.bus.notify(head)
		}
	}
	return res, err
}

func (s *notifyingStore) WaitForAppend(ctx context.Context, after int64) error {
	if s.waits != nil {
		select {
		case s.waits <- struct{}{}:
		default:
		}
	}
	for {
		s.bus.mu.Lock()
		head, ch := s.bus.head, s.bus.ch
		s.bus.mu.Unlock()
		if head > after {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// openStore returns a SQLite store on a new file and a function opening
// another store on the same file, each closed when the test ends.
func openStore(t *testing.T) (Store, func() Store) {
	t.Helper()
	db, path := openTestDB(t)
	s, err := NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.(io.Closer).Close() })
	another := func() Store {
		db2, err := OpenDB(path)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := NewSQLiteStore(db2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s2.(io.Closer).Close()
			db2.Close()
		})
		return s2
	}
	return s, another
}

// A hub over NewWithStore never closes the store; New's hub closes the
// SQLite store it made (its writer's connection), never the *sql.DB.
func TestNewWithStoreDoesNotCloseTheStore(t *testing.T) {
	s, _ := openStore(t)
	h, err := NewWithStore(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	first := mustPublish(t, h, "a", 1)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Append(context.Background(), []Event{{EventID: "after-close", Type: "message", Payload: []byte("2")}})
	if err != nil || res[0].Event.Sequence != first.Sequence+1 {
		t.Fatalf("the store after its hub closed: %+v, %v", res, err)
	}

	db, _ := openTestDB(t)
	h2, err := New(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	own := h2.store.(*sqlitestore.Store)
	h2.Close()
	if _, err := own.Append(context.Background(), []Event{{EventID: "x", Type: "message", Payload: []byte("1")}}); !errors.Is(err, sqlitestore.ErrClosed) {
		t.Fatalf("New's store after Close: %v, want it closed", err)
	}
	if err := db.Ping(); err != nil {
		t.Fatalf("the *sql.DB after Close: %v", err)
	}
}

// A tail over a Notifier is woken by another node's append at once: with a
// fallback interval of an hour, a row another hub appends is delivered
// within the test's bound.
func TestTailWokenByNotifier(t *testing.T) {
	s, another := openStore(t)
	b := newBus()
	waits := make(chan struct{}, 1)
	ha, err := NewWithStore(&notifyingStore{Store: s, bus: b, waits: waits}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	hb, err := NewWithStore(&notifyingStore{Store: another(), bus: b}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	got := recordLive(t, ha)
	stop, err := ha.StartTail(time.Hour, TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select { // the tail's first poll is done; it waits for an append now
	case <-waits:
	case <-time.After(waitFor):
		t.Fatal("the tail never waited for an append")
	}
	ev := mustPublish(t, hb, "a", "from b")
	wiretest.WaitUntil(t, "b's row delivered on a", func() bool { return len(got()) == 1 })
	if g := got(); g[0] != ev.Sequence {
		t.Fatalf("delivered %v, want [%d]", g, ev.Sequence)
	}
}

// gatedStore blocks the live catch-up's reads (global scope) on gate once
// armed, and reports when one is blocked.
type gatedStore struct {
	Store
	armed   chan struct{} // closed to arm
	blocked chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func (s *gatedStore) Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error) {
	select {
	case <-s.armed:
		if len(req.Scope) == 0 {
			s.once.Do(func() {
				s.blocked <- struct{}{}
				<-s.gate
			})
		}
	default:
	}
	return s.Store.Read(ctx, req)
}

// A slow catch-up read does not hold the delivery lock: while the tail's
// read of another node's rows is stuck, the lock is free, and once the read
// returns every row is delivered once, in order.
func TestCatchUpReadsWithoutTheDeliveryLock(t *testing.T) {
	s, another := openStore(t)
	gs := &gatedStore{Store: s, armed: make(chan struct{}), blocked: make(chan struct{}, 1), gate: make(chan struct{})}
	ha, err := NewWithStore(gs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	hb, err := NewWithStore(another(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	got := recordLive(t, ha)
	var want []int64
	for i := range 3 {
		want = append(want, mustPublish(t, hb, "", i).Sequence)
	}
	close(gs.armed)
	stop, err := ha.StartTail(time.Millisecond, TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select {
	case <-gs.blocked:
	case <-time.After(waitFor):
		t.Fatal("the tail never read")
	}
	release, ok := ha.live.TryHoldDispatch()
	if !ok {
		close(gs.gate)
		t.Fatal("the delivery lock is held during the catch-up's read")
	}
	release()
	close(gs.gate)
	wiretest.WaitUntil(t, "b's rows delivered on a", func() bool { return len(got()) == 3 })
	if g := got(); len(g) != 3 || g[0] != want[0] || g[2] != want[2] {
		t.Fatalf("delivered %v, want %v", g, want)
	}
}
