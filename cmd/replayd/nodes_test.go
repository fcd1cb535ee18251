package main_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd/internal/wiretest"
)

// pgPrefix returns the test cluster's DSN (.ci/pg.sh exports it) and a
// fresh table prefix whose tables are dropped at the end of the test. Without
// a cluster the test is skipped, or fails under CI=true.
func pgPrefix(t *testing.T) (dsn, prefix string) {
	t.Helper()
	if dsn = os.Getenv("REPLAYD_PG_DSN"); dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("REPLAYD_PG_DSN is not set under CI: source .ci/pg.sh")
		}
		t.Skip("REPLAYD_PG_DSN is not set; start PostgreSQL with: source .ci/pg.sh")
	}
	var b [6]byte
	rand.Read(b[:])
	prefix = "srv" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, table := range []string{"events", "head", "watermarks", "raw"} {
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+prefix+table); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return dsn, prefix
}

// Two serve processes on one PostgreSQL database are nodes of one log: an
// event published on either reaches live clients of both, and a client
// hopping from one to the other with its cursor gets every event once, in
// order.
func TestTwoNodesOnPostgres(t *testing.T) {
	dsn, prefix := pgPrefix(t)
	args := []string{"--postgres", dsn, "--postgres-table-prefix", prefix, "--publish-key", publishKey,
		"--token-key", secretFile(t), "--heartbeat", "1m", "--tail-interval", "200ms"}
	a := start(t, nil, args...)
	b := start(t, nil, args...)
	tok := token(t, farFuture(), "room-*")
	liveA := wiretest.Dial(t, a.base+"/events?topic=room-1&access_token="+tok, nil)
	liveA.Hello()
	liveB := wiretest.Dial(t, b.base+"/events?topic=room-1&access_token="+tok, nil)
	liveB.Hello()
	var seqs []int64
	for i := range 20 {
		node := []*daemon{a, b}[i%2]
		seqs = append(seqs, publish(t, node.base, "room-1", fmt.Sprint("n", i), i).Sequence)
	}
	for _, s := range seqs {
		liveA.NextIs(s, "live on node A")
		liveB.NextIs(s, "live on node B")
	}
	// A client hops: half the log on A, then on to B with its cursor, then
	// back to A.
	hop := []*daemon{a, b, a}
	cursor := int64(0)
	got := 0
	for i, node := range hop {
		c := wiretest.Dial(t, node.base+"/events?topic=room-1&access_token="+tok, wiretest.LastID(cursor))
		c.Hello()
		for n := 0; n < 7 && got < len(seqs); n++ {
			c.NextIs(seqs[got], fmt.Sprintf("hop %d", i))
			cursor = seqs[got]
			got++
		}
		c.Close()
	}
	if got != len(seqs) {
		t.Fatalf("the hopping client got %d of %d events", got, len(seqs))
	}
	// Node B's shutdown leaves node A serving.
	b.stop(t, syscall.SIGTERM)
	liveB.Ended("node B's stream after SIGTERM")
	next := publish(t, a.base, "room-1", "after-b", 0)
	liveA.NextIs(next.Sequence, "node A after node B stopped")

}
