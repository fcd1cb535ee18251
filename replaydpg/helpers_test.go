package replaydpg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/sseparse"
	"github.com/replayd/replayd/internal/testenv"
	"github.com/replayd/replayd/storage"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testenv.Report("replaydpg")
		if code == 0 && os.Getenv("REPLAYD_PG_DSN") == "" {
			// Every test here needs PostgreSQL, so none ran: say so
			// on go test's summary line too.
			testenv.NoTestsRan()
		}
		os.Exit(code)
	}))
}

// testDSN returns the DSN of the test cluster (.ci/pg.sh exports it).
func testDSN(t testing.TB) string {
	t.Helper()
	return testenv.Need(t, "PostgreSQL", "source .ci/pg.sh", "REPLAYD_PG_DSN")[0]
}

// testPrefix returns a fresh table prefix and drops its tables when the
// test ends, so tests run in parallel and leave nothing behind.
func testPrefix(t testing.TB) string {
	t.Helper()
	return testPrefixDSN(t, testDSN(t))
}

// testPrefixDSN is testPrefix on the cluster of dsn.
func testPrefixDSN(t testing.TB, dsn string) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	prefix := "t" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, table := range []string{"events", "head", "watermarks", "skips", "outbox", "raw", "streams", "stream_producers"} {
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+prefix+table); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return prefix
}

// openTestStore opens a store on a table prefix of its own.
func openTestStore(t testing.TB) (*Store, string) {
	t.Helper()
	prefix := testPrefix(t)
	return openPrefix(t, prefix), prefix
}

// openPrefix opens another store (another "node") on the same tables.
func openPrefix(t testing.TB, prefix string) *Store {
	t.Helper()
	return openPrefixDSN(t, prefix, testDSN(t))
}

func openPrefixDSN(t testing.TB, prefix, dsn string) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// withPoolSize sets pgxpool's pool_max_conns in a DSN of either form.
func withPoolSize(dsn string, n int) string {
	return withDSNParam(dsn, "pool_max_conns", strconv.Itoa(n))
}

// withDSNParam adds key=value (value without spaces or quotes) to a DSN of
// either form.
func withDSNParam(dsn, key, value string) string {
	if strings.Contains(dsn, "://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + key + "=" + value
	}
	return dsn + " " + key + "=" + value
}

// testPool is a plain pool for raw SQL in tests.
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testPoolDSN(t, testDSN(t))
}

func testPoolDSN(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ev(id, topic, payload string) replayd.Event {
	return replayd.Event{EventID: id, Type: "message", Topic: topic, Payload: []byte(payload)}
}

// mustAppend appends evs and fails on any error, whole or per event.
func mustAppend(t testing.TB, s *Store, evs ...replayd.Event) []AppendResult {
	t.Helper()
	res, err := s.Append(context.Background(), evs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("event %d: %v", i, r.Err)
		}
	}
	return res
}

// appendN appends n events round-robin over topics ("" a broadcast), in
// batches of at most 1,000, with ids prefix-i.
func appendN(t testing.TB, s *Store, n int, topics []string, prefix string) {
	t.Helper()
	for i := 0; i < n; {
		var batch []replayd.Event
		for ; i < n && len(batch) < 1000; i++ {
			batch = append(batch, ev(fmt.Sprintf("%s-%d", prefix, i), topics[i%len(topics)], fmt.Sprintf(`{"i":%d}`, i)))
		}
		mustAppend(t, s, batch...)
	}
}

// allEvents reads the whole retained log.
func allEvents(t testing.TB, s *Store) []replayd.Event {
	t.Helper()
	var out []replayd.Event
	var after int64
	for {
		evs, err := readAfter(context.Background(), s, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return out
		}
		out = append(out, evs...)
		after = evs[len(evs)-1].Sequence
	}
}

// readAfter returns up to limit events of every topic above after,
// ascending, through the contract's Read: the rows a live hub catches up on.
func readAfter(ctx context.Context, s *Store, after int64, limit int) ([]replayd.Event, error) {
	p, err := s.Read(ctx, storage.ReadRequest{After: after, Limit: limit})
	return p.Events, err
}

// sseFrame is one dispatched SSE frame.
type sseFrame struct{ id, event, data string }

// readSSE parses an SSE stream into frames until it ends, then closes out.
// Frames with neither an event type nor data (a lone retry) are skipped.
func readSSE(r io.Reader, out chan<- sseFrame) error {
	defer close(out)
	sr := sseparse.NewReader(r)
	for {
		f, err := sr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(f.Event) == 0 && len(f.Data) == 0 {
			continue
		}
		out <- sseFrame{id: string(f.ID), event: string(f.Event), data: string(f.Data)}
	}
}
