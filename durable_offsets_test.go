package replayd

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/sqlitetest"
	"github.com/replayd/replayd/storage"
)

// SPEC §19, offsets keep §18: an offset the log could not have issued for
// this stream (a deleted stream's earlier incarnation, another stream's,
// above the head, inside a skipped range of the sequence floor) is 410
// unknown_offset, one below what retention kept is 410 retention, in every
// read mode, and never answered with data.

// readGone reads the stream name from offset in each mode and fails the
// test unless each answers 410 with code.
func (e *dsEnv) readGone(t *testing.T, what, name, offset, code string) {
	t.Helper()
	for _, mode := range dsModes {
		a := dsDo(t, http.MethodGet, e.stream(name)+"?offset="+offset+mode, nil, nil)
		wantGone(t, fmt.Sprintf("%s (offset %s%s)", what, offset, mode), a, code)
	}
}

func TestDurableOffsetEarlierIncarnation(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	const name = "s"
	oldBase := e.dsCreate(t, name, "application/json")
	o1 := e.dsAppend(t, name, "application/json", `"old-1"`)
	o2 := e.dsAppend(t, name, "application/json", `"old-2"`)
	if a := dsDo(t, http.MethodDelete, e.stream(name), nil, nil); a.status != http.StatusNoContent {
		t.Fatalf("delete: %v", a)
	}
	// While deleted: 404 in every mode, for any offset.
	for _, mode := range dsModes {
		a := dsDo(t, http.MethodGet, e.stream(name)+"?offset="+o1+mode, nil, nil)
		wantStatus(t, "read of a deleted stream"+mode, a, http.StatusNotFound, "old-")
	}
	newBase := e.dsCreate(t, name, "application/json")
	e.dsAppend(t, name, "application/json", `"new-1"`)
	if seqOf(t, newBase) <= seqOf(t, o2) {
		t.Fatalf("the new incarnation's base %s is not above the old one's tail %s", newBase, o2)
	}
	for _, off := range []string{oldBase, o1, o2} {
		e.readGone(t, "an earlier incarnation's offset", name, off, "unknown_offset")
	}
	// The new incarnation reads from its base only its own.
	if a := e.dsRead(t, name, "-1"); string(a.body) != `["new-1"]` {
		t.Fatalf("new incarnation from -1: %s", a.body)
	}
}

func TestDurableOffsetOtherStream(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	aBase := e.dsCreate(t, "a", "application/json")
	a1 := e.dsAppend(t, "a", "application/json", `"a-secret-1"`)
	e.dsCreate(t, "b", "application/json")
	a2 := e.dsAppend(t, "a", "application/json", `"a-secret-2"`) // inside b's range
	e.dsAppend(t, "b", "application/json", `"b-1"`)
	for _, off := range []string{aBase, a1, a2} {
		e.readGone(t, "another stream's offset", "b", off, "unknown_offset")
	}
}

func TestDurableOffsetAboveHead(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "s", "application/json")
	tail := seqOf(t, e.dsAppend(t, "s", "application/json", `1`))
	// Between the stream's tail and the log's head (another topic's event),
	// and above the head.
	other := mustPublish(t, e.h, "other", "x")
	for _, seq := range []int64{tail + 1, other.Sequence, other.Sequence + 1, other.Sequence + 1000, 1<<63 - 1} {
		e.readGone(t, "an offset above the stream's tail", "s", offsetOf(seq), "unknown_offset")
	}
}

// An offset inside a range the sequence floor skipped (another open of
// the file raised the head, floor_test.go) was never issued.
func TestDurableOffsetSkippedRange(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "s", "application/json")
	last := seqOf(t, e.dsAppend(t, "s", "application/json", `1`))
	h2 := secondHub(t, e.path, Options{})
	head, err := h2.LatestSequence(t.Context())
	if err != nil || head <= last+2 {
		t.Fatalf("head %d (%v) after another open, want a range skipped above %d", head, err, last)
	}
	next := seqOf(t, e.dsAppend(t, "s", "application/json", `2`))
	if next <= head {
		t.Fatalf("append at %d inside the skipped range ..%d", next, head)
	}
	for _, seq := range []int64{last + 1, (last + head) / 2, head} {
		e.readGone(t, "an offset in a skipped range", "s", offsetOf(seq), "unknown_offset")
	}
	// The stream's own offsets still read.
	if a := e.dsRead(t, "s", offsetOf(last)); string(a.body) != "[2]" {
		t.Fatalf("read after %d: %s", last, a.body)
	}
}

// An offset below what retention kept is 410 retention: the client lost
// data and must know it.
func TestDurableOffsetRetention(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	base := e.dsCreate(t, "s", "application/json")
	o1 := e.dsAppend(t, "s", "application/json", `1`)
	o2 := e.dsAppend(t, "s", "application/json", `2`)
	e.dsAppend(t, "s", "application/json", `3`)
	e.dsAppend(t, "s", "application/json", `4`)
	// The log holds the ds.create marker and four messages: keeping two
	// deletes the marker and messages 1 and 2.
	n, err := e.h.Prune(t.Context(), storage.RetentionPolicy{MaxEvents: 2})
	if err != nil || n != 3 {
		t.Fatalf("prune: %d deleted, %v", n, err)
	}
	for _, off := range []string{base, o1} {
		e.readGone(t, "an offset retention deleted what follows", "s", off, "retention")
	}
	// From o2, the newest deleted message, what follows is all kept: the
	// answer is messages 3 and 4, or 410 retention (the handler cannot
	// tell a deleted event of the stream from an offset it never gave, so
	// it refuses; the client reads again from -1 and loses nothing).
	for _, mode := range dsModes[:2] {
		a := dsDo(t, http.MethodGet, e.stream("s")+"?offset="+o2+mode, nil, nil)
		switch {
		case a.status == http.StatusGone:
			wantGone(t, "read after the newest deleted message"+mode, a, "retention")
		case a.status != http.StatusOK || string(a.body) != "[3,4]":
			t.Fatalf("read after %s%s: %v", o2, mode, a)
		}
	}
	// From the start: what is kept.
	if a := e.dsRead(t, "s", "-1"); string(a.body) != "[3,4]" {
		t.Fatalf("read from -1: %s", a.body)
	}
}

// The same through a fork: its history is its source's segment, whose
// start is a position unless retention deleted what follows it.
func TestDurableOffsetRetentionFork(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	pbase := e.dsCreate(t, "p", "application/json")
	o1 := e.dsAppend(t, "p", "application/json", `1`)
	for _, m := range []string{`2`, `3`, `4`} {
		e.dsAppend(t, "p", "application/json", m)
	}
	fork := http.Header{"Content-Type": {"application/json"}, "Stream-Forked-From": {"/v1/stream/p"}}
	if a := dsDo(t, http.MethodPut, e.stream("f"), fork, nil); a.status != http.StatusCreated {
		t.Fatalf("fork: %v", a)
	}
	if a := e.dsRead(t, "f", pbase); string(a.body) != "[1,2,3,4]" {
		t.Fatalf("fork read from its source's base: %s", a.body)
	}
	// The log: p's marker, its four messages, f's marker; keeping four
	// deletes p's marker and message 1.
	if n, err := e.h.Prune(t.Context(), storage.RetentionPolicy{MaxEvents: 4}); err != nil || n != 2 {
		t.Fatalf("prune: %d deleted, %v", n, err)
	}
	for _, off := range []string{pbase, o1} {
		e.readGone(t, "a fork's offset retention deleted what follows", "f", off, "retention")
	}
}

// A log restored in place from a backup under its running hub (SQLite's
// online-backup API, as restore_test.go does it): the offsets of the lost
// history are 410 unknown_offset, before and after the stream's next
// append, which never reuses their sequences.
func TestDurableOffsetRestoredLog(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "s", "application/json")
	o1 := e.dsAppend(t, "s", "application/json", `"kept"`)
	backup := filepath.Join(t.TempDir(), "backup.db")
	sqlitetest.VacuumInto(t, e.path, backup)
	o2 := e.dsAppend(t, "s", "application/json", `"lost-1"`)
	o3 := e.dsAppend(t, "s", "application/json", `"lost-2"`)
	sqlitetest.RestoreInPlace(t, e.path, backup)
	for _, off := range []string{o2, o3} {
		e.readGone(t, "an offset of the lost history", "s", off, "unknown_offset")
	}
	o4 := e.dsAppend(t, "s", "application/json", `"after"`)
	if seqOf(t, o4) <= seqOf(t, o3) {
		t.Fatalf("the append after the restore got %s, at or below the lost history's %s", o4, o3)
	}
	for _, off := range []string{o2, o3} {
		e.readGone(t, "an offset of the lost history, after an append", "s", off, "unknown_offset")
	}
	if a := e.dsRead(t, "s", o1); string(a.body) != `["after"]` {
		t.Fatalf("read after the kept offset: %s", a.body)
	}
	if a := e.dsRead(t, "s", "-1"); strings.Contains(string(a.body), "lost") {
		t.Fatalf("read from -1 after the restore: %s", a.body)
	}
}
