package replaydpg

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/testenv"
	"github.com/replayd/replayd/storetest"
)

// bouncerDSNs returns the DSNs of the PgBouncer that .ci/pg.sh starts with
// REPLAYD_PG_PGBOUNCER=1, in transaction and in session pooling, in front
// of the test cluster. Without them the test skips on a developer machine
// and fails under CI=true.
func bouncerDSNs(t *testing.T) (transaction, session string) {
	t.Helper()
	env := testenv.Need(t, "PgBouncer", "REPLAYD_PG_PGBOUNCER=1 source .ci/pg.sh", "REPLAYD_PG_BOUNCER_DSN", "REPLAYD_PG_BOUNCER_SESSION_DSN")
	return env[0], env[1]
}

// Behind PgBouncer in session pooling, Open needs no option: two hubs on
// one log, the second woken by NOTIFY through the pooler.
func TestPgBouncerSessionPooling(t *testing.T) {
	_, session := bouncerDSNs(t)
	prefix := testPrefix(t)
	hubsOnTwoNodes(t, func() *Store { return openBouncer(t, session, WithTablePrefix(prefix)) })
}

// Behind PgBouncer in transaction pooling, with WithTransactionPooling and
// the listener on a session-level connection (WithListenDSN: the cluster
// directly): the store passes the conformance kit, and two hubs on one log
// work, the second woken by NOTIFY (its fallback poll is an hour).
func TestPgBouncerTransactionPooling(t *testing.T) {
	transaction, _ := bouncerDSNs(t)
	direct := testDSN(t)
	t.Run("NeedsListenDSN", func(t *testing.T) {
		s, err := Open(testCtx(t, 30*time.Second), transaction, WithTransactionPooling(), WithTablePrefix(testPrefix(t)))
		if !errors.Is(err, replayd.ErrInvalid) {
			if s != nil {
				s.Close()
			}
			t.Fatalf("Open with WithTransactionPooling and no WithListenDSN: %v, want ErrInvalid", err)
		}
	})
	t.Run("HubsOnTwoNodes", func(t *testing.T) {
		prefix := testPrefix(t)
		// A pool's DSN is accepted for the listener too (pool_max_conns is
		// not a server parameter).
		hubsOnTwoNodes(t, func() *Store {
			return openBouncer(t, transaction, WithTablePrefix(prefix), WithTransactionPooling(), WithListenDSN(withPoolSize(direct, 2)))
		})
	})
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) func() replayd.Store {
			prefix := testPrefix(t)
			return func() replayd.Store {
				return openBouncer(t, transaction, WithTablePrefix(prefix), WithTransactionPooling(), WithListenDSN(direct))
			}
		})
	})
}

func openBouncer(t *testing.T, dsn string, opts ...Option) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The pool's sessions plan generically (a SET after connecting, see Open)
// unless the DSN says otherwise, directly and behind a session-mode pooler;
// with WithTransactionPooling nothing is SET on the server's sessions.
func TestPlanCacheMode(t *testing.T) {
	direct := testDSN(t)
	transaction, session := os.Getenv("REPLAYD_PG_BOUNCER_DSN"), os.Getenv("REPLAYD_PG_BOUNCER_SESSION_DSN")
	cases := []struct {
		name, dsn string
		opts      []Option
		want      string
	}{
		{"direct", direct, nil, "force_generic_plan"},
		{"direct, the DSN's", withDSNParam(direct, "plan_cache_mode", "force_custom_plan"), nil, "force_custom_plan"},
		{"session pooling", session, nil, "force_generic_plan"},
		{"transaction pooling", transaction, []Option{WithTransactionPooling(), WithListenDSN(direct)}, "auto"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.dsn == "" {
				bouncerDSNs(t) // skips, or fails under CI
			}
			s := openBouncer(t, c.dsn, append(c.opts, WithTablePrefix(testPrefix(t)))...)
			var mode string
			if err := s.pool.QueryRow(testCtx(t, 10*time.Second), "SHOW plan_cache_mode").Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if mode != c.want {
				t.Fatalf("plan_cache_mode %s, want %s", mode, c.want)
			}
		})
	}
}

// Publish is durable even where the server's default is not: a session
// whose synchronous_commit is off (the CI cluster runs with it off) is set
// to on, and a DSN that sets it keeps its own choice.
func TestSynchronousCommit(t *testing.T) {
	direct := testDSN(t)
	cases := []struct{ name, dsn, want string }{
		{"the server's off is raised", withDSNParam(direct, "options", "-csynchronous_commit=off"), "on"},
		{"the DSN's own", withDSNParam(direct, "synchronous_commit", "off"), "off"},
		{"local is kept", withDSNParam(direct, "options", "-csynchronous_commit=local"), "local"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openPrefixDSN(t, testPrefix(t), c.dsn)
			var got string
			if err := s.pool.QueryRow(testCtx(t, 10*time.Second), "SHOW synchronous_commit").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("synchronous_commit %s, want %s", got, c.want)
			}
		})
	}
}
