package replayd

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// Deleting the database file under a running hub, or moving another
// database over it, is caught: Publish fails with ErrLogReplaced within a
// bounded time instead of acknowledging rows into a file nobody will open
// again, and the cause is logged at Error once.
func TestLogFileDeletedOrReplaced(t *testing.T) {
	cases := []struct {
		name    string
		replace func(t *testing.T, path string)
	}{
		{"deleted", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
		{"replaced", func(t *testing.T, path string) {
			other := filepath.Join(t.TempDir(), "other.db")
			db, err := OpenDB(other)
			if err != nil {
				t.Fatal(err)
			}
			h, err := New(db, Options{})
			if err != nil {
				t.Fatal(err)
			}
			mustPublish(t, h, "other", 1)
			h.Close()
			db.Close()
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db, path := openTestDB(t)
			logs := &wiretest.LogRecorder{}
			h := newTestHub(t, db, Options{Logger: slog.New(logs)})
			mustPublish(t, h, "t", 1)
			tc.replace(t, path)
			start := time.Now()
			acked := publishUntilRefused(t, h)
			t.Logf("refused %v after the %s, %d publishes acknowledged meanwhile", time.Since(start).Round(time.Millisecond), tc.name, acked)
			if _, err := h.Publish(context.Background(), "t", 2); !errors.Is(err, ErrLogReplaced) {
				t.Fatalf("the next publish: %v, want ErrLogReplaced", err)
			}
			if n := logs.Count(slog.LevelError, "database file", "path", path); n != 1 {
				t.Fatalf("%d Error logs naming %s, want 1:\n%s", n, path, logs)
			}
		})
	}
}

// A tailing hub notices the file is gone without any publish.
func TestLogFileDeletedNoticedByTail(t *testing.T) {
	db, path := openTestDB(t)
	logs := &wiretest.LogRecorder{}
	h := newTestHub(t, db, Options{Logger: slog.New(logs)})
	stop, err := h.StartTail(10*time.Millisecond, TailOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	wiretest.WaitUntil(t, "the tail to log the deleted file", func() bool {
		return logs.Has(slog.LevelError, "database file", "path", path)
	})
	if _, err := h.Publish(context.Background(), "t", 1); !errors.Is(err, ErrLogReplaced) {
		t.Fatalf("publish after the tail saw the file deleted: %v, want ErrLogReplaced", err)
	}
}

// publishUntilRefused publishes every few milliseconds until Publish fails
// with ErrLogReplaced, failing the test on any other error or if that
// takes longer than waitFor; it returns how many publishes succeeded.
func publishUntilRefused(t *testing.T, h *EventHub) int {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitFor)
	for acked := 0; ; acked++ {
		_, err := h.Publish(context.Background(), "t", acked)
		switch {
		case errors.Is(err, ErrLogReplaced):
			return acked
		case err != nil:
			t.Fatalf("publish: %v, want ErrLogReplaced", err)
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("Publish still acknowledged %d events %v after the file changed", acked, waitFor)
		}
	}
}
