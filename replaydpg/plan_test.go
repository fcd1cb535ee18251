package replaydpg

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// planNode is the part of EXPLAIN (ANALYZE, FORMAT JSON) the test reads.
type planNode struct {
	NodeType    string     `json:"Node Type"`
	RelName     string     `json:"Relation Name"`
	IndexName   string     `json:"Index Name"`
	ActualRows  float64    `json:"Actual Rows"`
	ActualLoops float64    `json:"Actual Loops"`
	Filtered    float64    `json:"Rows Removed by Filter"`
	Plans       []planNode `json:"Plans"`
}

// TestQueryPlans runs every scope read under EXPLAIN ANALYZE on 20,000 rows,
// without and with statistics, from cursor 0 and from near the head, with
// custom and generic plans, and checks that no node scans a table
// sequentially or bitmap-scans it, and that no scan returns more than
// (groups)*(limit+1) rows: the reads are index probes bounded by the limit,
// never a sort of everything above the cursor (which an OR, a UNION ALL
// with only an outer LIMIT, or a range bounded by two parameters without
// statistics would be).
func TestQueryPlans(t *testing.T) {
	t.Parallel()
	s, _ := openTestStore(t)
	ctx := testCtx(t, 60*time.Second)
	// Broadcasts and the topic "rare" are sparse: a scan that filters a
	// wider range instead of probing the scope's own index entries reads
	// far more rows than it returns.
	var mix []string
	for i := range 500 {
		switch {
		case i == 0:
			mix = append(mix, "rare")
		case i%100 == 0:
			mix = append(mix, "")
		default:
			mix = append(mix, []string{"a", "b", "c"}[i%3])
		}
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// No statistics until the test gathers them: autovacuum would at a
	// moment of its own.
	if _, err := conn.Exec(ctx, "ALTER TABLE "+s.prefix+"events SET (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 20000, mix, "p")
	head, err := s.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 10
	// A wider global page, the limit+1 rows of which pass the 0.5% of the
	// table that a range bounded by two parameters is estimated at without
	// statistics; its bound is 20 times the limit's. (Not for topics: the
	// broadcasts' branch of every topic read, "topic IS NULL AND sequence
	// > $2", is estimated at a few rows without statistics, and a limit
	// above that gets a bitmap scan of the broadcasts above the cursor.)
	const wide = 20*(limit+1) - 1
	// Each scope without statistics, then with them: a plan that depends
	// on them may differ between the two (a range bounded by two
	// parameters is estimated at 0.5% of the table without them).
	analyzed := false
	planN := 0 // names the prepared statements
	for _, pass := range []struct {
		stats  bool
		topics []string
	}{{false, []string{"rare"}}, {false, []string{"a", "c"}}, {true, []string{"rare"}}, {true, []string{"a", "c"}}} {
		topics, stats := pass.topics, pass.stats
		if stats && !analyzed {
			if _, err := conn.Exec(ctx, "ANALYZE "+s.prefix+"events"); err != nil {
				t.Fatal(err)
			}
			analyzed = true
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
				t.Fatal(err)
			}
			for _, cursor := range []int64{0, head - 30} {
				for _, q := range []struct {
					name   string
					sql    string
					args   []any
					groups int
				}{
					{"oldest topics", s.q.oldestTopics, []any{topics, cursor, limit + 1}, len(topics) + 1},
					{"count topics", s.q.countTopics, []any{topics, cursor}, len(topics) + 1},
					{"newest sequences topics", s.q.newestSeqTopics, []any{topics, cursor, limit + 1}, len(topics) + 1},
					{"newest sequences global", s.q.newestSeqGlobal, []any{cursor, limit + 1}, 1},
					{"oldest global", s.q.oldestGlobal, []any{cursor, limit + 1}, 1},
					{"count global", s.q.countGlobal, []any{cursor}, 1},
					// Read's pages, with and without bounds on bytes and
					// sequences: a page reads at most limit+1 rows per group.
					{"page topics", s.q.pageTopics, []any{topics, cursor, int64(math.MaxInt64), limit, int64(math.MaxInt64)}, len(topics) + 1},
					{"page topics, bounded", s.q.pageTopics, []any{topics, cursor, head - 5, limit, 20}, len(topics) + 1},
					{"page global", s.q.pageGlobal, []any{cursor, int64(math.MaxInt64), limit, int64(math.MaxInt64)}, 1},
					{"page global, bounded", s.q.pageGlobal, []any{cursor, head - 5, limit, 20}, 1},
					{"page global, wide", s.q.pageGlobal, []any{cursor, head, wide, int64(math.MaxInt64)}, 20},
					// ReadStream's: one topic, no broadcasts.
					{"stream page", s.q.streamPage, []any{topics[0], cursor, int64(math.MaxInt64), limit, int64(math.MaxInt64)}, 1},
					{"stream page, bounded", s.q.streamPage, []any{topics[0], cursor, head - 5, limit, 20}, 1},
					{"stream last", s.q.streamLast, []any{topics[0]}, 1},
					{"stream at", s.q.streamAt, []any{topics[0], cursor}, 1},
				} {
					var out []byte
					// plan_cache_mode applies to a statement PREPAREd on
					// the server and EXPLAINed as EXECUTE: a prepared
					// EXPLAIN plans its query with the parameters' values,
					// a custom plan whatever the mode.
					// Numbered: a name past 63 bytes is truncated by the
					// server (cursors are sequences near the clock in
					// microseconds: the sequence floor).
					planN++
					name := fmt.Sprintf("plan_%d", planN)
					if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+q.sql); err != nil {
						t.Fatal(err)
					}
					// EXECUTE takes literals here: the server infers no
					// parameter types for a utility statement.
					params := make([]string, len(q.args))
					for i, a := range q.args {
						switch a := a.(type) {
						case []string:
							params[i] = "ARRAY['" + strings.Join(a, "', '") + "']"
						case string:
							params[i] = "'" + a + "'"
						default:
							params[i] = fmt.Sprint(a)
						}
					}
					if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE "+name+"("+strings.Join(params, ", ")+")").Scan(&out); err != nil {
						t.Fatalf("%s: %v", q.name, err)
					}
					var generic, custom int64
					if err := conn.QueryRow(ctx, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1", name).Scan(&generic, &custom); err != nil {
						t.Fatal(err)
					}
					if (generic > 0) != (mode == "force_generic_plan") || generic+custom != 1 {
						t.Fatalf("%s, %s: %d generic and %d custom plans", q.name, mode, generic, custom)
					}
					var plans []struct{ Plan planNode }
					if err := json.Unmarshal(out, &plans); err != nil {
						t.Fatal(err)
					}
					bound := float64(q.groups * (limit + 1))
					var walk func(n planNode)
					walk = func(n planNode) {
						switch n.NodeType {
						case "Seq Scan", "Bitmap Heap Scan", "Bitmap Index Scan":
							t.Errorf("%s, %s, statistics %v, cursor %d: %s on %s%s", q.name, mode, stats, cursor, n.NodeType, n.RelName, n.IndexName)
						case "Index Scan", "Index Only Scan":
							if rows := (n.ActualRows + n.Filtered) * n.ActualLoops; rows > bound {
								t.Errorf("%s %q, %s, statistics %v, cursor %d: %s on %s read %v rows, bound %v", q.name, topics, mode, stats, cursor, n.NodeType, n.IndexName, rows, bound)
							}
						}
						for _, c := range n.Plans {
							walk(c)
						}
					}
					walk(plans[0].Plan)
					if t.Failed() {
						t.Logf("%s plan:\n%s", q.name, out)
						return
					}
				}
			}
		}
	}
}

// TestNoJIT: the store's sessions do not JIT-compile. The generic plan of a
// topic read estimates a tenth of the table for its LIMIT parameter, so on
// a log of a million rows its cost passes jit_above_cost and every
// execution spent 3-7 ms compiling (BenchmarkHandshake1M: a topic
// handshake cost ~7 ms against ~0.2 ms for the global scope). The test
// lowers jit_above_cost to 0 on one of the pool's sessions instead of
// building a million rows.
func TestNoJIT(t *testing.T) {
	t.Parallel()
	s, _ := openTestStore(t)
	ctx := testCtx(t, 30*time.Second)
	appendN(t, s, 10, []string{"a", ""}, "j")
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// pg_jit_available is false where jit is off: ask a session of a
	// plain pool.
	var available bool
	if err := testPool(t).QueryRow(ctx, "SELECT pg_jit_available()").Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Skip("this server has no JIT")
	}
	if _, err := conn.Exec(ctx, "SET jit_above_cost = 0"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET jit_above_cost")
	var out string
	if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+s.q.newestSeqTopics, []string{"a"}, int64(0), 11).Scan(&out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, `"JIT"`) {
		t.Fatalf("the read was JIT-compiled:\n%s", out)
	}
}
