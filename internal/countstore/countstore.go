// Package countstore wraps the SQLite store to count what the job-stream
// tests and measurements need: commits and bytes read. It is a package of
// its own, not part of sqlitetest, because sqlitestore's own tests import
// sqlitetest.
package countstore

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// CountingStore is the SQLite store (every method of it, so that a hub
// uses it as it uses the store) counting the transactions it committed
// and the payload bytes its stream reads returned.
type CountingStore struct {
	*sqlitestore.Store
	Commits   atomic.Int64 // UpdateStreams and Appends that committed
	ReadBytes atomic.Int64 // payload bytes ReadStream returned
}

// OpenCounting opens a CountingStore on the database file at path (a
// pool of its own); store and pool are closed at the end of the test
// (after a hub on it that was opened later).
func OpenCounting(t testing.TB, path string) *CountingStore {
	t.Helper()
	db, err := sqlitestore.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	return &CountingStore{Store: s}
}

func (s *CountingStore) UpdateStreams(ctx context.Context, topics []string, fn func(storage.StreamTx) error) error {
	err := s.Store.UpdateStreams(ctx, topics, fn)
	if err == nil {
		s.Commits.Add(1)
	}
	return err
}

func (s *CountingStore) Append(ctx context.Context, evs []storage.Event) ([]storage.AppendResult, error) {
	r, err := s.Store.Append(ctx, evs)
	if err == nil {
		s.Commits.Add(1)
	}
	return r, err
}

func (s *CountingStore) ReadStream(ctx context.Context, req storage.StreamReadRequest) (storage.StreamPage, error) {
	p, err := s.Store.ReadStream(ctx, req)
	for _, ev := range p.Events {
		s.ReadBytes.Add(int64(len(ev.Payload)))
	}
	return p, err
}
