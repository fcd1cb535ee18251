package replayd

import (
	"context"
	"database/sql"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// Shared test helpers: a hub on a real SQLite file and a real HTTP server.
// The SSE client, the poll requests and the recorders the tests share with
// hubtest are internal/wiretest's.

// waitFor bounds every wait in the tests.
const waitFor = wiretest.WaitFor

// openTestDB opens a fresh database file in t.TempDir and closes it at the
// end of the test.
func openTestDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.db")
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

// newTestHub returns a hub on db, closed at the end of the test.
func newTestHub(t testing.TB, db *sql.DB, opts Options) *EventHub {
	t.Helper()
	if testDetach {
		opts.SSE.DetachConnections = true
	}
	h, err := New(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// secondHub opens the database file at path again, with its own pool, as
// another process would, and returns a hub on it; hub and pool are closed
// at the end of the test.
func secondHub(t testing.TB, path string, opts Options) *EventHub {
	t.Helper()
	db, err := OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return newTestHub(t, db, opts)
}

// serve starts a real HTTP server for h's handler.
func serve(t testing.TB, h *EventHub) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func mustPublish(t testing.TB, h *EventHub, topic string, payload any, opts ...PublishOption) Event {
	t.Helper()
	ev, err := h.Publish(context.Background(), topic, payload, opts...)
	if err != nil {
		t.Fatalf("publish %q: %v", topic, err)
	}
	return ev
}

// frame is one parsed SSE frame; gapJSON a gap frame's data, with nulls
// kept as nil (internal/wiretest reads both).
type (
	frame   = wiretest.Frame
	gapJSON = wiretest.Gap
)

func i64p(v int64) *int64 { return &v }

func seqs(evs []Event) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Sequence
	}
	return out
}
