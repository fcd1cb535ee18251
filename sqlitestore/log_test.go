package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd/storage"
)

// oldSchema is the schema of replayd before the ordinals (issue 8, item 3).
var oldSchema = []string{
	`CREATE TABLE events (
		sequence   INTEGER PRIMARY KEY AUTOINCREMENT,
		event_id   TEXT    NOT NULL UNIQUE,
		type       TEXT    NOT NULL,
		topic      TEXT,
		payload    TEXT    NOT NULL,
		created_at INTEGER NOT NULL
	)`,
	`CREATE INDEX events_topic_sequence ON events (topic, sequence)`,
	`CREATE TABLE events_prune_watermarks (
		topic    TEXT    PRIMARY KEY,
		sequence INTEGER NOT NULL
	) WITHOUT ROWID`,
}

// insertOld inserts n rows the way an earlier version did: no ordinals.
// Topics cycle through a, b, c with every fifth row a broadcast.
func insertOld(t testing.TB, db *sql.DB, from, n int) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < from+n; i++ {
		var topic any = []string{"a", "b", "c"}[i%3]
		if i%5 == 0 {
			topic = nil
		}
		if _, err := tx.Exec(`INSERT INTO events (event_id, type, topic, payload, created_at) VALUES (?, 'message', ?, '{}', ?)`,
			fmt.Sprintf("old-%d", i), topic, time.Now().UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// bruteCount counts a scope's rows in (after, before) one by one.
func bruteCount(t testing.TB, db *sql.DB, topics []string, after, before int64) storage.Span {
	t.Helper()
	var s storage.Span
	if err := db.QueryRow(scopeQuery(kindCount, len(topics)), scopeArgs(topics, after, before)...).Scan(&s.Count, &s.First, &s.Last); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkCounts compares span with the row-by-row count over random ranges
// and scopes.
func checkCounts(t *testing.T, db *sql.DB, l *Store, head int64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 8))
	scopes := [][]string{nil, {"a"}, {"b"}, {"a", "c"}, {"a", "b", "c"}, {"nobody"}}
	for range 300 {
		scope := scopes[rng.IntN(len(scopes))]
		after := rng.Int64N(head + 2)
		before := after + rng.Int64N(head+3-after)
		got, err := l.span(context.Background(), db, scope, after, before)
		if err != nil {
			t.Fatal(err)
		}
		if want := bruteCount(t, db, scope, after, before); got != want {
			t.Fatalf("span %v (%d, %d) = %+v, want %+v", scope, after, before, got, want)
		}
	}
}

func TestOrdinalCountsExactAcrossPrunes(t *testing.T) {
	db, path := openTestDB(t)
	h := openTestStore(t, db)
	// A second writer on the same file, as another process would be: each
	// writer's cached numbering must notice the other's rows.
	h2 := secondStore(t, path)
	ctx := context.Background()
	for i := range 600 {
		topic := []string{"a", "b", "c", ""}[i%4]
		if i%7 < 2 {
			mustAppend(t, h2, topic, i)
			continue
		}
		mustAppend(t, h, topic, i)
		if i%97 == 0 { // a duplicate id spends no ordinal
			mustAppend(t, h, topic, i, fmt.Sprintf("dup-%d", i))
			mustAppend(t, h, topic, i, fmt.Sprintf("dup-%d", i))
		}
	}
	head, _ := h.Head(ctx)
	checkCounts(t, db, h, head)
	if _, err := h.Prune(ctx, storage.RetentionPolicy{MaxEvents: 250}); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, db, h, head)
	// Everything pruned: numbering restarts, still without holes.
	if _, err := h.Prune(ctx, storage.RetentionPolicy{MaxEvents: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`DELETE FROM events`); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		mustAppend(t, h, []string{"a", "b", ""}[i%3], i)
	}
	head, _ = h.Head(ctx)
	checkCounts(t, db, h, head)
}

func TestMigrateOrdinalsFromOldSchema(t *testing.T) {
	db, path := openTestDB(t)
	for _, q := range oldSchema {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	const old = 2*backfillBatch + 321
	insertOld(t, db, 0, old)
	// A pruned prefix, as an earlier version's retention left it.
	if _, err := db.Exec(`DELETE FROM events WHERE sequence <= 100`); err != nil {
		t.Fatal(err)
	}
	h := openTestStore(t, db)
	var unnumbered int
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE ordinal IS NULL OR topic_ordinal IS NULL`).Scan(&unnumbered); err != nil || unnumbered != 0 {
		t.Fatalf("%d rows left unnumbered (%v)", unnumbered, err)
	}
	var idx []string
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' AND name LIKE 'events_topic%'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		rows.Scan(&n)
		idx = append(idx, n)
	}
	rows.Close()
	if len(idx) != 1 || idx[0] != "events_topic_sequence_ordinal" {
		t.Fatalf("topic indexes after migration: %v", idx)
	}
	for i := range 30 {
		mustAppend(t, h, []string{"a", "b", ""}[i%3], i)
	}
	checkCounts(t, db, h, old+30)

	// An earlier version still writing the file appends unnumbered rows:
	// counts stay exact (row by row), this version's rows stay unnumbered
	// behind them, and the next New numbers them all.
	insertOld(t, db, old, 40)
	mustAppend(t, h, "a", "after an old writer")
	var last sql.NullInt64
	if err := db.QueryRow(`SELECT ordinal FROM events ORDER BY sequence DESC LIMIT 1`).Scan(&last); err != nil || last.Valid {
		t.Fatalf("a row after unnumbered ones got ordinal %v (%v)", last, err)
	}
	checkCounts(t, db, h, old+71)
	secondStore(t, path)
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE ordinal IS NULL`).Scan(&unnumbered); err != nil || unnumbered != 0 {
		t.Fatalf("%d rows left unnumbered after the second New (%v)", unnumbered, err)
	}
	mustAppend(t, h, "b", "numbered again")
	if err := db.QueryRow(`SELECT ordinal FROM events ORDER BY sequence DESC LIMIT 1`).Scan(&last); err != nil || !last.Valid {
		t.Fatalf("the newest row has ordinal %v (%v)", last, err)
	}
	checkCounts(t, db, h, old+72)
}

// The replay queries must be index range scans merged by sequence, never a
// MULTI-INDEX OR or a temp B-tree sort (measured ~5x slower at 1M rows).
func TestReplayQueryPlans(t *testing.T) {
	db, _ := openTestDB(t)
	openTestStore(t, db)
	kinds := map[int]string{kindReplay: "replay", kindPage: "page", kindLatest: "latest", kindBoundary: "boundary", kindOrdinals: "ordinals", kindCount: "count"}
	for _, n := range []int{0, 1, 2, 32} {
		for kind, name := range kinds {
			name := fmt.Sprintf("%s/%d topics", name, n)
			topics := make([]string, n)
			for i := range topics {
				topics[i] = fmt.Sprintf("t%d", i)
			}
			rows, err := db.Query("EXPLAIN QUERY PLAN "+scopeQuery(kind, n), scopeArgs(topics, 1, 100, 10)...)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var plan []string
			for rows.Next() {
				var id, parent, unused int
				var detail string
				if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, detail)
			}
			rows.Close()
			all := strings.Join(plan, " | ")
			for _, bad := range []string{"TEMP B-TREE", "MULTI-INDEX OR", "SCAN events"} {
				if strings.Contains(all, bad) {
					t.Errorf("%s plan uses %s: %s", name, bad, all)
				}
			}
			if n == 0 {
				continue
			}
			scans := n + 1
			if kind == kindOrdinals {
				scans = 2 * (n + 1)
			}
			if got := strings.Count(all, "USING INDEX events_topic_sequence_ordinal") + strings.Count(all, "USING COVERING INDEX events_topic_sequence_ordinal"); got != scans {
				t.Errorf("%s plan is %d index range scans, want %d: %s", name, got, scans, all)
			}
			if kind == kindReplay || kind == kindLatest || kind == kindBoundary || kind == kindPage {
				if !strings.Contains(all, "MERGE (UNION ALL)") {
					t.Errorf("%s plan does not merge: %s", name, all)
				}
			}
		}
	}
}

// A read that took a cached statement just before the store's Close closed
// it runs the query from its text: reads keep working after Close.
func TestReadWithAStatementClosedByClose(t *testing.T) {
	db, _ := openTestDB(t)
	l := openTestStore(t, db)
	ev := mustAppend(t, l, "a", 1)
	ctx := context.Background()
	if _, err := l.Read(ctx, storage.ReadRequest{Scope: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	q := scopeQuery(kindPage, 1)
	st := l.stmts.load(q)
	if st == nil {
		t.Fatal("the page query was not cached by a read")
	}
	l.stmts.close() // what Close does to the statements
	rows, prepared, err := l.stmts.queryWith(ctx, db, st, q, scopeArgs([]string{"a"}, 0, maxSequence, 101)...)
	if err != nil {
		t.Fatalf("read with the closed statement: %v", err)
	}
	var p storage.Page
	err = readPage(rows, storage.ReadRequest{Limit: 100, MaxBytes: maxInt}, &p)
	rows.Close()
	if err != nil || prepared || p.Head != ev.Sequence || len(p.Events) != 1 {
		t.Fatalf("read: %+v, prepared %v, %v; want head %d, one event, from the text", p, prepared, err, ev.Sequence)
	}
}

// TestWriterNumbersAfterAnotherWriter: a writer that skips reading the
// newest row while no other connection has written (see
// logWriter.readLastRow) must notice every other writer's rows, so that
// ordinals stay 1, 2, 3, ... in the log and in each topic.
func TestWriterNumbersAfterAnotherWriter(t *testing.T) {
	db, path := openTestDB(t)
	s1 := openTestStore(t, db)
	s2 := secondStore(t, path)
	for i := range 40 {
		s := s1
		if i%3 == 1 {
			s = s2
		}
		mustAppend(t, s, []string{"a", "b", ""}[i%2], i)
		mustAppend(t, s, "a", i) // the same writer again: the cached path
	}
	n := eachNumbered(t, db, func(logRow) {})
	if n != 80 {
		t.Fatalf("%d rows, want 80", n)
	}
}
