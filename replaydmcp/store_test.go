package replaydmcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/storage"
)

// Data is stored byte for byte: text as is, and what a backend would refuse
// as text (invalid UTF-8, NUL, nothing) too.
func TestAppendByteForByte(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	s := New(openSQLite(t, tempDB(t)), Options{})
	mustOpen(t, s, "S", "a")
	want := [][]byte{
		[]byte(`{"jsonrpc":"2.0","method":"notifications/progress"}`),
		nil,
		{0xff, 0xfe, 'x'},
		[]byte("a\x00b"),
		[]byte("multi\nline\n\ndata"),
	}
	for _, d := range want {
		if err := s.Append(ctx, "S", "a", d); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	for d, err := range s.After(ctx, "S", "a", -1) {
		if err != nil {
			t.Fatal(err)
		}
		if string(d) != string(want[i]) {
			t.Errorf("data %d: got %q, want %q", i, d, want[i])
		}
		i++
	}
	if i != len(want) {
		t.Errorf("got %d data, want %d", i, len(want))
	}
}

// A store opened again on the file (a restarted server) continues each
// stream's numbering from the log, and replays what the first one stored.
func TestRestartContinuesNumbering(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	path := tempDB(t)
	s1 := New(openSQLite(t, path), Options{})
	mustOpen(t, s1, "S", "", "a")
	mustAppend(t, s1, "S", "a", "0", "1", "2")
	mustAppend(t, s1, "S", "", "g0")

	s2 := New(openSQLite(t, path), Options{})
	mustOpen(t, s2, "S", "") // an adopted session opens its standalone stream again
	mustAppend(t, s2, "S", "a", "3", "4")
	mustAppend(t, s2, "S", "", "g1")
	for _, s := range []*EventStore{s1, s2} {
		if got, err := collect(ctx, s, "S", "a", 1); err != nil || !slices.Equal(got, []string{"2", "3", "4"}) {
			t.Errorf("After(a, 1): got %v, %v; want [2 3 4]", got, err)
		}
		if got, err := collect(ctx, s, "S", "", 0); err != nil || !slices.Equal(got, []string{"g1"}) {
			t.Errorf("After(\"\", 0): got %v, %v; want [g1]", got, err)
		}
	}
}

// Two processes (two stores on one file) appending to one stream at once
// give each append its own index: every datum is replayed exactly once.
func TestConcurrentAppendersShareNumbering(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	path := tempDB(t)
	stores := []*EventStore{New(openSQLite(t, path), Options{}), New(openSQLite(t, path), Options{})}
	mustOpen(t, stores[0], "S", "x")
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for w, s := range stores {
		wg.Go(func() {
			for i := range n {
				if err := s.Append(ctx, "S", "x", fmt.Appendf(nil, "w%d-%d", w, i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := collect(ctx, stores[1], "S", "x", -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2*n {
		t.Fatalf("got %d data, want %d", len(got), 2*n)
	}
	seen := map[string]bool{}
	next := [2]int{}
	for _, d := range got {
		if seen[d] {
			t.Fatalf("%s replayed twice", d)
		}
		seen[d] = true
		var w, i int
		fmt.Sscanf(d, "w%d-%d", &w, &i)
		if i != next[w] {
			t.Fatalf("writer %d: got %d, want %d (its appends out of order)", w, i, next[w])
		}
		next[w]++
	}
	// Resuming from each index gives exactly the rest.
	for idx := -1; idx < 2*n; idx += 17 {
		rest, err := collect(ctx, stores[0], "S", "x", idx)
		if err != nil || !slices.Equal(rest, got[idx+1:]) {
			t.Fatalf("After(%d): got %d data, %v; want %d", idx, len(rest), err, len(got)-idx-1)
		}
	}
}

// SessionClosed ends the session for every process over the log, and
// leaves other sessions alone.
func TestSessionClosedEverywhere(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	path := tempDB(t)
	s1, s2 := New(openSQLite(t, path), Options{}), New(openSQLite(t, path), Options{})
	mustOpen(t, s1, "A", "", "1")
	mustOpen(t, s1, "B", "", "1")
	mustAppend(t, s1, "A", "1", "a")
	mustAppend(t, s1, "B", "1", "b")
	if err := s1.SessionClosed(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*EventStore{s1, s2} {
		for _, stream := range []string{"", "1"} {
			if got, err := collect(ctx, s, "A", stream, -1); err == nil || !strings.Contains(err.Error(), "unknown session ID") {
				t.Errorf("closed session, stream %q: got %v, %v; want an unknown session error", stream, got, err)
			}
		}
		if got, err := collect(ctx, s, "B", "1", -1); err != nil || !slices.Equal(got, []string{"b"}) {
			t.Errorf("open session: got %v, %v", got, err)
		}
	}
}

// SessionClosed deletes the session's rows (its streams' and its own, but
// the mark of its end), and no other session's; the session stays closed.
func TestSessionClosedDeletesItsRows(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	st := openSQLite(t, tempDB(t))
	s := New(st, Options{})
	mustOpen(t, s, "A", "", "1", "2")
	mustOpen(t, s, "B", "1")
	mustAppend(t, s, "A", "1", "a1", "a2")
	mustAppend(t, s, "A", "2", "a3")
	mustAppend(t, s, "B", "1", "b")
	rows := func(topic string) int {
		t.Helper()
		page, err := st.Read(ctx, storage.ReadRequest{Scope: []string{topic}, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Events)
	}
	if err := s.SessionClosed(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{"", "1", "2"} {
		if n := rows(streamTopic("A", stream)); n != 0 {
			t.Errorf("stream %q of the closed session: %d rows left", stream, n)
		}
	}
	if n := rows(sessionTopic("A")); n != 1 {
		t.Errorf("the closed session's topic: %d rows, want 1 (the mark of its end)", n)
	}
	if got, err := collect(ctx, s, "A", "1", -1); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("closed session: got %v, %v; want a closed session error", got, err)
	}
	if n := rows(streamTopic("B", "1")); n != 1 {
		t.Errorf("the other session's stream: %d rows, want 1", n)
	}
	if got, err := collect(ctx, s, "B", "1", -1); err != nil || !slices.Equal(got, []string{"b"}) {
		t.Errorf("open session: got %v, %v", got, err)
	}
}

// A stream whose every row was pruned answers ErrEventsPurged, never an
// empty replay, and cannot be appended to by a process that lost its
// numbering; a process that knows it goes on.
func TestStreamPrunedWhole(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	path := tempDB(t)
	keep := storage.RetentionPolicy{MaxEvents: 1}
	s1 := New(openSQLite(t, path), Options{Retention: keep, PruneInterval: -1})
	mustOpen(t, s1, "S", "", "a", "b")
	mustAppend(t, s1, "S", "a", "a0", "a1")
	mustAppend(t, s1, "S", "b", "b0") // the one row kept
	if _, err := s1.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	for _, idx := range []int{-1, 0, 1, 5} {
		if got, err := collect(ctx, s1, "S", "a", idx); !errors.Is(err, mcp.ErrEventsPurged) || got != nil {
			t.Errorf("After(a, %d): got %v, %v; want only ErrEventsPurged", idx, got, err)
		}
	}
	// The standalone stream never had data: its record went, but nothing
	// of it was lost, so a fresh GET (index -1) replays nothing, no error.
	if got, err := collect(ctx, s1, "S", "", -1); err != nil || got != nil {
		t.Errorf("After(\"\", -1) of a stream that never had data: got %v, %v; want nothing", got, err)
	}
	s2 := New(openSQLite(t, path), Options{})
	if err := s2.Append(ctx, "S", "a", []byte("x")); !errors.Is(err, errNumberingLost) {
		t.Errorf("Append by a store that never saw the stream: %v; want errNumberingLost", err)
	}
	mustAppend(t, s1, "S", "a", "a2") // s1 knows the next index
	if got, err := collect(ctx, s2, "S", "a", 1); err != nil || !slices.Equal(got, []string{"a2"}) {
		t.Errorf("After(a, 1): got %v, %v; want [a2]", got, err)
	}
	if got, err := collect(ctx, s2, "S", "a", 0); !errors.Is(err, mcp.ErrEventsPurged) {
		t.Errorf("After(a, 0): got %v, %v; want ErrEventsPurged (a1 is gone)", got, err)
	}
}

// With Retention and a PruneInterval, Append prunes by itself.
func TestAppendPrunes(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	s := New(openSQLite(t, tempDB(t)), Options{Retention: storage.RetentionPolicy{MaxEvents: 5}, PruneInterval: time.Nanosecond})
	mustOpen(t, s, "S", "a")
	for i := range 20 {
		mustAppend(t, s, "S", "a", fmt.Sprint(i))
	}
	if _, err := collect(ctx, s, "S", "a", 10); !errors.Is(err, mcp.ErrEventsPurged) {
		t.Errorf("After(10) with 5 rows kept: %v; want ErrEventsPurged", err)
	}
	if got, err := collect(ctx, s, "S", "a", 15); err != nil || !slices.Equal(got, []string{"16", "17", "18", "19"}) {
		t.Errorf("After(15): got %v, %v", got, err)
	}
}

// An ended ctx is an error, promptly; nothing is yielded.
func TestEndedContext(t *testing.T) {
	s := New(openSQLite(t, tempDB(t)), Options{})
	mustOpen(t, s, "S", "a")
	mustAppend(t, s, "S", "a", "x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Append(ctx, "S", "a", []byte("y")); err == nil {
		t.Error("Append with an ended ctx: no error")
	}
	if got, err := collect(ctx, s, "S", "a", -1); err == nil {
		t.Errorf("After with an ended ctx: got %v, no error", got)
	}
	if got, err := collect(context.Background(), s, "S", "a", -1); err != nil || !slices.Equal(got, []string{"x"}) {
		t.Errorf("After: got %v, %v; want [x]", got, err)
	}
}
