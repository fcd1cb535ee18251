package main_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/replayd/replayd/internal/wiretest"
)

// Issue 28: the operator restores a backup over the file of a running
// `replayd serve` with sqlite3's ".restore" (SQLite's online-backup API, a
// second OS process taking SQLite's locks). The backup was taken after the
// 3rd event; the 4th to 8th were read by clients since. Whatever the
// server publishes next must not reuse their sequences, and every client
// kind resuming from the 8th (a poll, SSE with Last-Event-ID, `replayd
// tail --state`) gets an unknown_cursor gap, never the new events as if
// they followed the lost ones.
func TestServeRestoreInPlace(t *testing.T) {
	sqlite3 := needTool(t, "sqlite3")
	dir := t.TempDir()
	db, backup, state := filepath.Join(dir, "r.db"), filepath.Join(dir, "bk.db"), filepath.Join(dir, "tail.json")
	d := start(t, nil, serveArgs(t, db)...)
	sqlite := func(cmd string) {
		t.Helper()
		if out, err := exec.CommandContext(t.Context(), sqlite3, db, cmd).CombinedOutput(); err != nil {
			t.Fatalf("sqlite3 %s %q: %v\n%s", db, cmd, err, out)
		}
	}
	var lost []int64
	for i := range 8 {
		if i == 3 {
			sqlite(".backup " + backup)
		}
		lost = append(lost, publish(t, d.base, "pub-r", fmt.Sprint("old", i), i).Sequence)
	}
	// A tail reads the 8 events and saves the 8th as its cursor.
	tl := startTail(t, d.base, "--topic", "pub-r", "--state", state, "--transport", "poll")
	for _, s := range lost {
		if l := tl.next(t); l.Sequence != s {
			t.Fatalf("line %s: want sequence %d", l.raw, s)
		}
	}
	if _, err := tl.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	c8 := lost[7]
	if got := readState(t, state); got != c8 {
		t.Fatalf("state holds %d, want %d", got, c8)
	}

	sqlite(".restore " + backup)
	fresh := publish(t, d.base, "pub-r", "new0", "after the restore").Sequence
	if slices.Contains(lost, fresh) || fresh < c8 {
		t.Fatalf("the first event after the restore got %d: the lost history had %v", fresh, lost)
	}

	// A poll from the 8th.
	p := wiretest.Poll(t, d.base, fmt.Sprintf("topic=pub-r&cursor=%d", c8))
	if p.Gap == nil || p.Gap.Reason != "unknown_cursor" || len(p.Events) != 0 || p.Cursor < fresh {
		t.Fatalf("poll from %d after the restore: %+v, want an unknown_cursor gap", c8, p)
	}
	// SSE resuming at the 8th.
	c := wiretest.Dial(t, d.base+"/events?topic=pub-r", wiretest.LastID(c8))
	if _, _, cursor, _ := c.Hello(); cursor < fresh {
		t.Fatalf("SSE resuming at %d: hello cursor %d, want the head (at least %d)", c8, cursor, fresh)
	}
	if g := wiretest.MustGap(t, c.Next()); g.Reason != "unknown_cursor" {
		t.Fatalf("SSE resuming at %d: gap %s, want unknown_cursor", c8, g.String())
	}
	// The tail, with its saved cursor: the gap first, then the next event.
	tl = startTail(t, d.base, "--topic", "pub-r", "--state", state)
	if l := tl.next(t); l.Gap == nil || l.Gap.Reason != "unknown_cursor" {
		t.Fatalf("replayd tail --state from %d: first line %s, want an unknown_cursor gap", c8, l.raw)
	}
	next := publish(t, d.base, "pub-r", "new1", "next").Sequence
	if l := tl.next(t); l.Gap != nil || l.Sequence != next {
		t.Fatalf("replayd tail after the gap: %s, want sequence %d", l.raw, next)
	}
	if f := c.NextNonHeartbeat(); f.ID != fmt.Sprint(next) {
		t.Fatalf("SSE after the gap: %+v, want id %d", f, next)
	}
	if _, err := tl.signal(t, syscall.SIGINT); err != nil {
		t.Fatalf("after SIGINT: %v", err)
	}
}
