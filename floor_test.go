package replayd

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// A new log's head, once opened, is the clock in microseconds; every open
// raises it again, recording the skipped range, and AUTOINCREMENT goes on
// above it.
func TestSequenceFloorOnOpen(t *testing.T) {
	db, path := openTestDB(t)
	before := time.Now().UnixMicro()
	h := newTestHub(t, db, Options{})
	h1, _ := h.LatestSequence(t.Context())
	if h1 < before || h1 > time.Now().UnixMicro() {
		t.Fatalf("head of a new log %d, want the clock at its open (%d..)", h1, before)
	}
	ev := mustPublish(t, h, "", 1)
	if ev.Sequence != h1+1 {
		t.Fatalf("first sequence %d, want %d", ev.Sequence, h1+1)
	}
	h2 := secondHub(t, path, Options{})
	head, _ := h2.LatestSequence(t.Context())
	if head <= ev.Sequence+1 {
		t.Fatalf("head %d after another open, want above %d", head, ev.Sequence+1)
	}
	if next := mustPublish(t, h, "", 2); next.Sequence != head+1 {
		t.Fatalf("sequence %d after the floor %d", next.Sequence, head+1)
	}
	var skips []string
	rows, err := db.Query(`SELECT after, through FROM events_skips ORDER BY after`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a, b int64
		rows.Scan(&a, &b)
		skips = append(skips, fmt.Sprint(a, "-", b))
	}
	if want := []string{fmt.Sprint(0, "-", h1), fmt.Sprint(ev.Sequence, "-", head)}; fmt.Sprint(skips) != fmt.Sprint(want) {
		t.Fatalf("skips %v, want %v", skips, want)
	}
}

// A clock behind the head (stepped back, or a log that outran it) raises
// nothing: the head stays, appends go on above it, and New logs a warning.
func TestSequenceFloorClockBehind(t *testing.T) {
	db, path := openTestDB(t)
	h := newTestHub(t, db, Options{})
	future := time.Now().Add(time.Hour).UnixMicro()
	if _, err := db.Exec(`UPDATE sqlite_sequence SET seq = ? WHERE name = 'events'`, future); err != nil {
		t.Fatal(err)
	}
	h.Close()
	rec := &wiretest.LogRecorder{}
	h2 := secondHub(t, path, Options{Logger: slog.New(rec)})
	if head, _ := h2.LatestSequence(context.Background()); head != future {
		t.Fatalf("head %d, want %d: nothing raised", head, future)
	}
	if !rec.Has(slog.LevelWarn, "the clock is behind the log's head", "head", fmt.Sprint(future)) {
		t.Fatalf("no warning logged: %s", rec.String())
	}
	if ev := mustPublish(t, h2, "", 1); ev.Sequence != future+1 {
		t.Fatalf("sequence %d, want %d", ev.Sequence, future+1)
	}
}
