package replayd

import (
	"context"
	"errors"
	"testing"
)

// Prune on a closed hub returns ErrClosed, as every call on a hub after
// Close does, and deletes nothing. (TestChaos on PostgreSQL found a prune
// racing a hub's restart returning the closed store's own error.)
func TestPruneAfterClose(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	mustPublish(t, h, "", 1)
	mustPublish(t, h, "", 2)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := h.Prune(context.Background(), RetentionPolicy{MaxEvents: 1})
	if !errors.Is(err, ErrClosed) || n != 0 {
		t.Fatalf("Prune after Close: %d deleted, %v; want 0, ErrClosed", n, err)
	}
}

// A prune the hub's Close overtakes, whose store then fails (closed by its
// owner after the hub, as NewWithStore's doc asks), returns ErrClosed too.
func TestPruneOvertakenByClose(t *testing.T) {
	db, _ := openTestDB(t)
	s, err := NewSQLiteStore(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.(interface{ Close() error }).Close() })
	blocked := &pruneBlockingStore{Store: s, entered: make(chan struct{}), release: make(chan struct{})}
	h, err := NewWithStore(blocked, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pruned := make(chan error, 1)
	go func() {
		_, err := h.Prune(context.Background(), RetentionPolicy{MaxEvents: 1})
		pruned <- err
	}()
	<-blocked.entered
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	close(blocked.release) // the store, closed by its owner, fails the prune
	if err := <-pruned; !errors.Is(err, ErrClosed) {
		t.Fatalf("Prune overtaken by Close: %v; want ErrClosed", err)
	}
}

// pruneBlockingStore's Prune waits for release, then fails as a closed
// store would.
type pruneBlockingStore struct {
	Store
	entered, release chan struct{}
}

var errTestStoreClosed = errors.New("test: store is closed")

func (s *pruneBlockingStore) Prune(ctx context.Context, policy RetentionPolicy) (int64, error) {
	close(s.entered)
	<-s.release
	return 0, errTestStoreClosed
}
