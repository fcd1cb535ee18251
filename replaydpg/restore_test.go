package replaydpg

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
	"github.com/replayd/replayd/internal/wiretest"
)

// Log identity on PostgreSQL, as an operator restores a log (hubtest.CheckRestore):
// pg_dump of the log's tables while it runs, the original lost, the dump
// restored with pg_restore into a fresh database, and a node opening it.
func TestRestoreFromDump(t *testing.T) {
	t.Parallel()
	r, d := dumpedLog(t)
	r.Restore = func(h *replayd.EventHub) *replayd.EventHub {
		h.Close()
		restored := freshDatabase(t)
		run(t, d.pgRestore, "-d", restored, "--no-owner", d.file)
		return hubOn(t, openPrefixDSN(t, d.prefix, restored))
	}
	hubtest.CheckRestore(t, r)
}

// dump is where dumpedLog's Backup dumps the log's tables, and with what
// to restore them.
type dump struct {
	dsn, prefix, file, pgRestore string
}

// dumpedLog is the Open and Backup of a hubtest.Restore on PostgreSQL: a
// node on a log of its own, and pg_dump of the log's tables while it runs.
func dumpedLog(t *testing.T) (hubtest.Restore, dump) {
	pgDump := pgTool(t, "pg_dump")
	d := dump{dsn: testDSN(t), prefix: testPrefix(t),
		file: filepath.Join(t.TempDir(), "log.dump"), pgRestore: pgTool(t, "pg_restore")}
	return hubtest.Restore{
		Open: func() *replayd.EventHub { return hubOn(t, openPrefixDSN(t, d.prefix, d.dsn)) },
		Backup: func(h *replayd.EventHub) *replayd.EventHub {
			run(t, pgDump, "-d", d.dsn, "-Fc", "-t", d.prefix+"*", "-f", d.file)
			return h
		},
	}, d
}

// Log identity on PostgreSQL when the log is restored in place, under its
// running node (hubtest.CheckRestore with Restore returning the same hub):
// the log's tables emptied and the dump loaded back into them with
// pg_restore --data-only, which sets the head row (and the outbox's
// identity) back to the dump's, while the node keeps its pool and its
// prepared statements.
func TestRestoreInPlace(t *testing.T) {
	t.Parallel()
	r, d := dumpedLog(t)
	r.Restore = func(h *replayd.EventHub) *replayd.EventHub {
		tables := []string{"events", "head", "watermarks", "skips", "outbox"}
		for i, tb := range tables {
			tables[i] = d.prefix + tb
		}
		if _, err := testPool(t).Exec(t.Context(), "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
			t.Fatal(err)
		}
		run(t, d.pgRestore, "-d", d.dsn, "--data-only", "--no-owner", d.file)
		return h
	}
	hubtest.CheckRestore(t, r)
}

// A head row lost (deleted by an operator, left out of a partial restore)
// with rows left: Open recreates it above them, publishes work and reuse
// no sequence.
func TestLostHeadRowWithRows(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	old := mustAppend(t, s, ev("a", "", `1`), ev("b", "t", `2`), ev("c", "", `3`))
	s.Close()
	deleteHeadRow(t, prefix)

	s = openPrefix(t, prefix)
	h := hubOn(t, s)
	if err := h.Ready(t.Context()); err != nil {
		t.Fatalf("Ready after the head row was recreated: %v", err)
	}
	last := old[2].Event.Sequence
	for i := range 3 {
		ev, err := h.Publish(t.Context(), "t", i)
		if err != nil {
			t.Fatalf("publish after the head row was lost: %v", err)
		}
		if ev.Sequence <= last {
			t.Fatalf("sequence %d after %d: reused", ev.Sequence, last)
		}
		last = ev.Sequence
	}
	// The old events are still served to a client resuming below them.
	p := wiretest.Poll(t, wiretest.ServePoll(t, h), "cursor=0")
	if p.Gap != nil || len(p.Events) != 6 || p.Events[0].ID != old[0].Event.Sequence {
		t.Fatalf("poll from 0: %+v", p)
	}
}

// A head row lost after every row was pruned (watermark 6): Open recreates
// it from the watermark, so no sequence is reused; a client at 6 gets the
// new events (its history agrees up to 6), one at 3 a pruned gap and then
// the new events, over SSE and polls: never a silent skip, never a stream
// that ends at once on every reconnect.
func TestLostHeadRowAllPruned(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	var old []int64
	for i := range 6 {
		old = append(old, mustAppend(t, s, ev(fmt.Sprint("old", i), "", `0`))[0].Event.Sequence)
	}
	time.Sleep(20 * time.Millisecond)
	if n, err := s.Prune(t.Context(), replayd.RetentionPolicy{MaxAge: time.Millisecond}); err != nil || n != 6 {
		t.Fatalf("prune all: %d, %v", n, err)
	}
	s.Close()
	deleteHeadRow(t, prefix)

	h := hubOn(t, openPrefix(t, prefix))
	url := wiretest.ServePoll(t, h)
	var fresh []int64
	for i := range 8 {
		ev, err := h.Publish(t.Context(), "", i)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Sequence <= old[5] {
			t.Fatalf("sequence %d reused (the old log went to %d)", ev.Sequence, old[5])
		}
		fresh = append(fresh, ev.Sequence)
	}
	c6, c3 := old[5], old[2]
	// At 6: every new event, no gap.
	if p := wiretest.Poll(t, url, fmt.Sprintf("cursor=%d", c6)); p.Gap != nil || !slices.Equal(p.IDs(), fresh) {
		t.Fatalf("poll at %d: %+v, want %v", c6, p, fresh)
	}
	s6 := wiretest.Dial(t, url+"/events", wiretest.LastID(c6))
	s6.Hello()
	if got := wiretest.FrameIDs(s6.Events(8)); !slices.Equal(got, ids(fresh)) {
		t.Fatalf("SSE at %d: %v, want %v", c6, got, fresh)
	}
	// At 3: a pruned gap through 6, then every new event.
	p := wiretest.Poll(t, url, fmt.Sprintf("cursor=%d", c3))
	if p.Gap == nil || p.Gap.Reason != "pruned" || *p.Gap.MissedThrough != c6 || !slices.Equal(p.IDs(), fresh) {
		t.Fatalf("poll at %d: %+v, want a pruned gap through %d and %v", c3, p, c6, fresh)
	}
	s3 := wiretest.Dial(t, url+"/events", wiretest.LastID(c3))
	s3.Hello()
	if g := wiretest.MustGap(t, s3.Next()); g.Reason != "pruned" || *g.MissedThrough != c6 {
		t.Fatalf("SSE at %d: gap %s", c3, g.String())
	}
	if got := wiretest.FrameIDs(s3.Events(8)); !slices.Equal(got, ids(fresh)) {
		t.Fatalf("SSE at %d: %v, want %v", c3, got, fresh)
	}
}

// When the head row was lost and the server's clock is not above the
// highest sequence stored, Open cannot tell which sequences the log issued
// above it: it refuses, with an error that says what to do.
func TestLostHeadRowClockBehindRefused(t *testing.T) {
	t.Parallel()
	s, prefix := openTestStore(t)
	future := time.Now().Add(time.Hour).UnixMicro()
	if _, err := testPool(t).Exec(t.Context(), "UPDATE "+prefix+"head SET seq = $1", future); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, ev("a", "", `1`))
	s.Close()
	deleteHeadRow(t, prefix)
	_, err := Open(t.Context(), testDSN(t), WithTablePrefix(prefix))
	if err == nil || !strings.Contains(err.Error(), "cannot tell which sequences") {
		t.Fatalf("Open with the head row lost and the clock behind: %v", err)
	}
	// With the head row in place, a clock behind is no reason to refuse.
	if _, err := testPool(t).Exec(t.Context(), "INSERT INTO "+prefix+"head (id, seq, ord, created_at) VALUES (1, $1, 1, now())", future+1); err != nil {
		t.Fatal(err)
	}
	s = openPrefix(t, prefix)
	if r := mustAppend(t, s, ev("b", "", `2`)); r[0].Event.Sequence != future+2 {
		t.Fatalf("sequence %d, want %d", r[0].Event.Sequence, future+2)
	}
}

func ids(seqs []int64) []string {
	out := make([]string, len(seqs))
	for i, s := range seqs {
		out[i] = fmt.Sprint(s)
	}
	return out
}

func deleteHeadRow(t *testing.T, prefix string) {
	t.Helper()
	if _, err := testPool(t).Exec(t.Context(), "DELETE FROM "+prefix+"head"); err != nil {
		t.Fatal(err)
	}
}

// hubOn returns a hub over s, closed (with s) at the end of the test.
func hubOn(t *testing.T, s *Store) *replayd.EventHub {
	t.Helper()
	h, err := replayd.NewWithStore(s, replayd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// freshDatabase creates an empty database on the test cluster, dropped at
// the end of the test, and returns its DSN.
func freshDatabase(t *testing.T) string {
	t.Helper()
	name := "restore_" + strings.TrimSuffix(testPrefix(t), "_")
	pool := testPool(t)
	if _, err := pool.Exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return withDSNParam(testDSN(t), "dbname", name)
}

// pgTool finds a PostgreSQL client program: beside the server .ci/pg.sh
// runs (REPLAYD_PG_BIN, or the newest /usr/lib/postgresql/*/bin), or on
// the PATH. Missing, it skips the test, or fails it under CI=true.
func pgTool(t *testing.T, name string) string {
	t.Helper()
	dirs := []string{os.Getenv("REPLAYD_PG_BIN")}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.Reverse(found) // the newest first, as long as versions have as many digits
	dirs = append(dirs, found...)
	for _, dir := range dirs {
		if p := filepath.Join(dir, name); dir != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found: %v", name, err)
		}
		t.Skipf("%s not found: %v", name, err)
	}
	return p
}

func run(t *testing.T, prog string, args ...string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), prog, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", filepath.Base(prog), args, err, out)
	}
}
