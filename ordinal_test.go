package replayd

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
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
func bruteCount(t testing.TB, db *sql.DB, topics []string, after, before int64) span {
	t.Helper()
	var s span
	if err := db.QueryRow(scopeQuery(kindCount, len(topics)), scopeArgs(topics, after, before)...).Scan(&s.count, &s.first, &s.last); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkCounts compares span with the row-by-row count over random ranges
// and scopes.
func checkCounts(t *testing.T, db *sql.DB, l *sqliteStore, head int64) {
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
	h := newTestHub(t, db, Options{})
	// A second writer on the same file, as another process would be: each
	// writer's cached numbering must notice the other's rows.
	h2 := secondHub(t, path, Options{})
	ctx := context.Background()
	for i := range 600 {
		topic := []string{"a", "b", "c", ""}[i%4]
		if i%7 < 2 {
			mustPublish(t, h2, topic, i)
			continue
		}
		mustPublish(t, h, topic, i)
		if i%97 == 0 { // a duplicate id spends no ordinal
			mustPublish(t, h, topic, i, WithEventID(fmt.Sprintf("dup-%d", i)))
			mustPublish(t, h, topic, i, WithEventID(fmt.Sprintf("dup-%d", i)))
		}
	}
	head, _ := h.LatestSequence(ctx)
	checkCounts(t, db, h.store.s.(*sqliteStore), head)
	if _, err := h.Prune(ctx, RetentionPolicy{MaxEvents: 250}); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, db, h.store.s.(*sqliteStore), head)
	// Everything pruned: numbering restarts, still without holes.
	if _, err := h.Prune(ctx, RetentionPolicy{MaxEvents: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`DELETE FROM events`); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		mustPublish(t, h, []string{"a", "b", ""}[i%3], i)
	}
	head, _ = h.LatestSequence(ctx)
	checkCounts(t, db, h.store.s.(*sqliteStore), head)
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
	h := newTestHub(t, db, Options{})
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
		mustPublish(t, h, []string{"a", "b", ""}[i%3], i)
	}
	checkCounts(t, db, h.store.s.(*sqliteStore), old+30)

	// An earlier version still writing the file appends unnumbered rows:
	// counts stay exact (row by row), this version's rows stay unnumbered
	// behind them, and the next New numbers them all.
	insertOld(t, db, old, 40)
	mustPublish(t, h, "a", "after an old writer")
	var last sql.NullInt64
	if err := db.QueryRow(`SELECT ordinal FROM events ORDER BY sequence DESC LIMIT 1`).Scan(&last); err != nil || last.Valid {
		t.Fatalf("a row after unnumbered ones got ordinal %v (%v)", last, err)
	}
	checkCounts(t, db, h.store.s.(*sqliteStore), old+71)
	secondHub(t, path, Options{})
	if err := db.QueryRow(`SELECT count(*) FROM events WHERE ordinal IS NULL`).Scan(&unnumbered); err != nil || unnumbered != 0 {
		t.Fatalf("%d rows left unnumbered after the second New (%v)", unnumbered, err)
	}
	mustPublish(t, h, "b", "numbered again")
	if err := db.QueryRow(`SELECT ordinal FROM events ORDER BY sequence DESC LIMIT 1`).Scan(&last); err != nil || !last.Valid {
		t.Fatalf("the newest row has ordinal %v (%v)", last, err)
	}
	checkCounts(t, db, h.store.s.(*sqliteStore), old+72)
}
