package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testenv.Report("examples/cluster")
		if code == 0 && os.Getenv("REPLAYD_PG_DSN") == "" {
			testenv.NoTestsRan() // its one test needs PostgreSQL
		}
		os.Exit(code)
	}))
}

// The demo end to end on a real PostgreSQL (REPLAYD_PG_DSN, as .ci/pg.sh
// exports it; without it the test skips, unless CI=true, when it fails):
// the client, bouncing A → B → A with its Last-Event-ID, reads every event
// published on both nodes up to its last one exactly once, in order, each
// resume replaying at least what was published while it was away.
func TestClusterDemo(t *testing.T) {
	dsn := testenv.Need(t, "PostgreSQL", "source .ci/pg.sh", "REPLAYD_PG_DSN")[0]
	var out strings.Builder
	res, err := run(context.Background(), dsn, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.received) == 0 {
		t.Fatal("the client read nothing")
	}
	last := res.received[len(res.received)-1]
	var want []int64
	for _, s := range res.published {
		if s <= last {
			want = append(want, s)
		}
	}
	if fmt.Sprint(res.received) != fmt.Sprint(want) {
		t.Fatalf("the client read %v, want every published event up to its last: %v", res.received, want)
	}
	if len(res.replayed) != 3 || res.replayed[0] != 0 || res.replayed[1] < awayCount || res.replayed[2] < awayCount {
		t.Fatalf("replayed per connection %v, want [0 ≥%d ≥%d]", res.replayed, awayCount, awayCount)
	}
}
