package replayd_test

import (
	"database/sql"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
)

// Log identity on SQLite, as an operator restores a log after a disk loss
// (hubtest.CheckRestore): from a backup made with VACUUM INTO while the
// log runs, and from a plain copy of the file of a stopped log.
func TestRestoreFromBackup(t *testing.T) {
	path := func(t *testing.T) string { return filepath.Join(t.TempDir(), "log.db") }
	t.Run("VacuumInto", func(t *testing.T) {
		orig, backup := path(t), path(t)
		hubtest.CheckRestore(t, hubtest.Restore{
			Open: func() *replayd.EventHub { return openHub(t, orig, replayd.Options{}) },
			Backup: func(h *replayd.EventHub) *replayd.EventHub {
				db, err := replayd.OpenDB(orig)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				if _, err := db.Exec(`VACUUM INTO ?`, backup); err != nil {
					t.Fatal(err)
				}
				return h
			},
			Restore: func(h *replayd.EventHub) *replayd.EventHub {
				h.Close()
				return openHub(t, backup, replayd.Options{})
			},
		})
	})
	t.Run("FileCopyOfAStoppedLog", func(t *testing.T) {
		orig, backup := path(t), path(t)
		var db *sql.DB
		hubtest.CheckRestore(t, hubtest.Restore{
			Open: func() *replayd.EventHub {
				var h *replayd.EventHub
				h, db = openHubDB(t, orig)
				return h
			},
			Backup: func(h *replayd.EventHub) *replayd.EventHub {
				h.Close()
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
				copyFile(t, orig, backup)
				return openHub(t, orig, replayd.Options{})
			},
			Restore: func(h *replayd.EventHub) *replayd.EventHub {
				h.Close()
				return openHub(t, backup, replayd.Options{})
			},
		})
	})
}

// openHubDB is openHub, returning the pool too, so that a test can stop
// the log (close both) before the end of the test.
func openHubDB(t *testing.T, path string) (*replayd.EventHub, *sql.DB) {
	db, err := replayd.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	h, err := replayd.New(db, replayd.Options{})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		db.Close()
	})
	return h, db
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(from + "-wal"); err == nil {
		t.Fatalf("%s-wal is left: the log was not stopped cleanly", from)
	}
}
