package sqlitestore

import (
	"bytes"
	"os"
	"testing"
	"time"
)

// TestCheckpointsOffTheAppend: the writer's commits never checkpoint the
// WAL themselves (SQLite's automatic checkpoint, inside the COMMIT that
// takes the WAL past wal_autocheckpoint pages, copied pages into the
// database file and synced it before Append returned); the checkpointer
// does, on its own goroutine. In WAL mode only a checkpoint writes the
// database file, so the file stays as it was while the checkpointer is
// held, whatever is appended.
func TestCheckpointsOffTheAppend(t *testing.T) {
	db, path := openTestDB(t)
	s := openTestStore(t, db)
	if s.ckpt == nil {
		t.Fatal("no checkpointer on a WAL database")
	}
	held, release := make(chan struct{}, 1), make(chan struct{})
	done := make(chan struct{}, 64)
	s.ckpt.testHook = func() {
		select {
		case held <- struct{}{}:
		default:
		}
		<-release
	}
	s.ckpt.testDone = func() {
		select {
		case done <- struct{}{}:
		default:
		}
	}
	before := readFile(t, path)
	// A one-row commit writes about five pages: 1,000 of them are several
	// automatic checkpoints' worth.
	for i := range 1000 {
		mustAppend(t, s, "t", i)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no checkpoint became due after 1,000 appends")
	}
	if !bytes.Equal(readFile(t, path), before) {
		close(release)
		t.Fatal("the database file changed while the checkpointer was held: a commit checkpointed the WAL itself")
	}
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the checkpoint did not finish")
	}
	if bytes.Equal(readFile(t, path), before) {
		t.Fatal("the checkpointer's checkpoint wrote nothing to the database file")
	}
	var autoCheckpoint int64
	if err := s.writer.conn.QueryRowContext(t.Context(), "PRAGMA wal_autocheckpoint").Scan(&autoCheckpoint); err != nil {
		t.Fatal(err)
	}
	if autoCheckpoint != 0 {
		t.Fatalf("the writer's wal_autocheckpoint = %d, want 0", autoCheckpoint)
	}
}

// TestCheckpointsKeepTheWALBounded: appends without a pause, each
// checkpoint overlapping the next commit, still leave a WAL of about the
// size SQLite's automatic checkpoints keep (the writer takes over when
// the checkpointer falls behind); and Close gives the writer's connection
// back with its automatic checkpoints on.
func TestCheckpointsKeepTheWALBounded(t *testing.T) {
	db, path := openTestDB(t)
	s := openTestStore(t, db)
	var pageSize int64
	if err := db.QueryRow("PRAGMA page_size").Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	limit := (behindFactor + 2) * s.ckpt.due * pageSize
	var largest int64
	for i := range 4000 {
		mustAppend(t, s, "t", i)
		if i%100 == 0 {
			if fi, err := os.Stat(path + "-wal"); err == nil {
				largest = max(largest, fi.Size())
			}
		}
	}
	if largest > limit {
		t.Fatalf("the WAL grew to %d bytes, more than %d (%d pages of %d)", largest, limit, limit/pageSize, pageSize)
	}
	t.Logf("largest WAL: %d bytes (%d pages); limit %d pages", largest, largest/pageSize, limit/pageSize)

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Every idle connection of the pool, the writer's given back among
	// them, holds one at a time so that each is a different one.
	idle := db.Stats().Idle
	for range idle {
		conn, err := db.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var autoCheckpoint int64
		if err := conn.QueryRowContext(t.Context(), "PRAGMA wal_autocheckpoint").Scan(&autoCheckpoint); err != nil {
			t.Fatal(err)
		}
		if autoCheckpoint != 1000 {
			t.Fatalf("a pool connection's wal_autocheckpoint = %d after Close, want 1000 back", autoCheckpoint)
		}
	}
	if idle == 0 {
		t.Fatal("no idle connection after Close: the writer's was not given back")
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
