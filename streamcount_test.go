package replayd

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// streamCountingStore is the SQLite store (every method of it, so the hub uses
// it as it uses the store) counting the stream transactions it committed
// and the payload bytes its stream reads returned.
type streamCountingStore struct {
	*sqlitestore.Store
	commits   atomic.Int64 // UpdateStreams that committed
	readBytes atomic.Int64 // payload bytes ReadStream returned
}

func (s *streamCountingStore) UpdateStreams(ctx context.Context, topics []string, fn func(storage.StreamTx) error) error {
	err := s.Store.UpdateStreams(ctx, topics, fn)
	if err == nil {
		s.commits.Add(1)
	}
	return err
}

func (s *streamCountingStore) ReadStream(ctx context.Context, req storage.StreamReadRequest) (storage.StreamPage, error) {
	p, err := s.Store.ReadStream(ctx, req)
	for _, ev := range p.Events {
		s.readBytes.Add(int64(len(ev.Payload)))
	}
	return p, err
}

// streamCountingHub opens a hub on a counting SQLite store of the file at path
// (a new pool); both are closed at the end of the test.
func streamCountingHub(t testing.TB, path string, opts Options) (*EventHub, *streamCountingStore) {
	t.Helper()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs := &streamCountingStore{Store: s}
	h, err := NewWithStore(cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(); s.Close(); db.Close() })
	return h, cs
}
