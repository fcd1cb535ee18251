package replaydmcp

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/testenv"
	"github.com/replayd/replayd/sqlitestore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.Cleanup(func(code int) {
			testenv.Report("replaydmcp")
			os.Exit(code)
		}),
		// Idle keep-alive connections of http.DefaultTransport's pool.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// openSQLite opens a SQLite store on path, closed when the test ends.
func openSQLite(t testing.TB, path string) *sqlitestore.Store {
	t.Helper()
	db, err := sqlitestore.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		db.Close()
	})
	return st
}

// tempDB returns the path of a fresh SQLite file in the test's directory.
func tempDB(t testing.TB) string { return filepath.Join(t.TempDir(), "mcp.db") }

// testCtx is a context that ends when the test does, or after d.
func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// collect reads After into strings, and its error.
func collect(ctx context.Context, s *EventStore, session, stream string, index int) ([]string, error) {
	var got []string
	for d, err := range s.After(ctx, session, stream, index) {
		if err != nil {
			return got, err
		}
		got = append(got, string(d))
	}
	return got, nil
}

func mustAppend(t testing.TB, s *EventStore, session, stream string, data ...string) {
	t.Helper()
	for _, d := range data {
		if err := s.Append(context.Background(), session, stream, []byte(d)); err != nil {
			t.Fatal(err)
		}
	}
}

func mustOpen(t testing.TB, s *EventStore, session string, streams ...string) {
	t.Helper()
	for _, st := range streams {
		if err := s.Open(context.Background(), session, st); err != nil {
			t.Fatal(err)
		}
	}
}
