package replaydmcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd/internal/testenv"
	"github.com/replayd/replayd/replaydpg"
)

// pgPrefix returns the test cluster's DSN and a fresh table prefix, whose
// tables are dropped when the test ends. Without REPLAYD_PG_DSN the test
// is skipped, or fails under CI=true.
func pgPrefix(t testing.TB) (dsn, prefix string) {
	dsn = testenv.Need(t, "PostgreSQL", "source .ci/pg.sh", "REPLAYD_PG_DSN")[0]
	var b [6]byte
	rand.Read(b[:])
	prefix = "mcp" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop the test tables: %v", err)
			return
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)", prefix)
		if err != nil {
			t.Errorf("drop the test tables: %v", err)
			return
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Errorf("drop the test tables: %v", err)
			return
		}
		for _, table := range tables {
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()+" CASCADE"); err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		}
	})
	return dsn, prefix
}

// Two server processes (nodes) on one PostgreSQL log. The client's tool
// call starts on node A; once it has 5 progress notifications, the proxy
// (a load balancer) sends its next requests to node B and cuts the
// response in flight. The client resumes with Last-Event-ID on B, which
// adopts the session and replays, reconnection after reconnection, what A
// goes on storing, the response included: the call returns, and the client
// has every progress notification exactly once, in order. Its next call
// runs on B.
func TestPGNextRequestToOtherNode(t *testing.T) {
	dsn, prefix := pgPrefix(t)
	testTwoNodes(t, childConfig{Addr: "127.0.0.1:0", PGDSN: dsn, PGPrefix: prefix})
}

// The same with two processes on one SQLite file.
func TestSharedSQLiteNextRequestToOtherNode(t *testing.T) {
	testTwoNodes(t, childConfig{Addr: "127.0.0.1:0", DB: tempDB(t)})
}

func testTwoNodes(t *testing.T, cfg childConfig) {
	_, addrA := startChild(t, cfg)
	_, addrB := startChild(t, cfg)
	a, b := "http://"+addrA, "http://"+addrB
	px := newProxy(t, a)
	c := connectClient(t, px.URL, 5)
	const n, m = 100, 10
	done := c.callCount(testCtx(t, 120*time.Second), n, 30)
	c.wait(t, 5)
	px.switchTo(b)
	if err := awaitCall(t, done, 90*time.Second); err != nil {
		t.Fatalf("the call, resumed on the other node: %v", err)
	}
	checkExactlyOnce(t, c.settle(n), n)
	if got := px.servedBy("GET", b); got == 0 {
		t.Fatal("node B served no GET: the client did not resume there")
	}
	// The next call, on B.
	if err := awaitCall(t, c.callCount(testCtx(t, 60*time.Second), m, 1), 60*time.Second); err != nil {
		t.Fatalf("the next call, on node B: %v", err)
	}
	checkExactlyOnce(t, c.settle(n + m)[n:], m)
	if px.servedBy("POST", b) == 0 {
		t.Fatal("node B served no POST")
	}
	t.Logf("node A: %d POST; node B: %d GET, %d POST", px.servedBy("POST", a), px.servedBy("GET", b), px.servedBy("POST", b))
}

// Node A is SIGKILLed mid-call (the proxy froze after 5 progress
// notifications, so the client misses what A stored next); the client's
// next requests go to node B, which replays from PostgreSQL every
// notification A stored, exactly once, in order, the missed ones
// included. The call died with A: the SDK client then ends it with an
// error, not a silent hole.
func TestPGNodeKilledOtherNodeResumes(t *testing.T) {
	dsn, prefix := pgPrefix(t)
	cfg := childConfig{Addr: "127.0.0.1:0", PGDSN: dsn, PGPrefix: prefix}
	childA, addrA := startChild(t, cfg)
	_, addrB := startChild(t, cfg)
	px := newProxy(t, "http://"+addrA)
	px.freezeAfter(5)
	c := connectClient(t, px.URL, 5)
	done := c.callCount(testCtx(t, 120*time.Second), 1000, 5)
	c.wait(t, 5)
	st, err := replaydpg.Open(testCtx(t, 30*time.Second), dsn, replaydpg.WithTablePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitStored(t, st, 20)
	childA.Kill()
	childA.Wait()
	stored := storedProgress(t, st)
	checkExactlyOnce(t, stored, len(stored))
	px.thaw()
	px.switchTo("http://" + addrB)
	callErr := awaitCall(t, done, 90*time.Second)
	checkExactlyOnce(t, c.settle(len(stored)), len(stored))
	if callErr == nil {
		t.Fatal("the call whose node was killed returned no error")
	}
	t.Logf("received %d of %d stored (5 before the freeze), then: %v", len(c.got()), len(stored), callErr)
}
