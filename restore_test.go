package replayd_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/hubtest"
	"github.com/replayd/replayd/internal/sqlitetest"
	"github.com/replayd/replayd/internal/wiretest"
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

// Log identity on SQLite when the log is restored in place, under its
// running hub (hubtest.CheckRestore with Restore returning the same hub):
// the backup taken with VACUUM INTO, then copied over the live file through
// SQLite's online-backup API (what sqlite3's ".restore" does), or its rows
// copied back over the live tables with ATTACH. Either goes through
// SQLite's locks on a connection of its own, as another process would,
// while the hub keeps its connections open on the file.
func TestRestoreInPlace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restore func(t testing.TB, orig, backup string)
	}{
		{"BackupAPI", sqlitetest.RestoreInPlace},
		{"RowsCopiedBack", restoreRowsCopiedBack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig, backup := filepath.Join(t.TempDir(), "log.db"), filepath.Join(t.TempDir(), "backup.db")
			hubtest.CheckRestore(t, hubtest.Restore{
				Open: func() *replayd.EventHub { return openHub(t, orig, replayd.Options{}) },
				Backup: func(h *replayd.EventHub) *replayd.EventHub {
					sqlitetest.VacuumInto(t, orig, backup)
					return h
				},
				Restore: func(h *replayd.EventHub) *replayd.EventHub {
					tc.restore(t, orig, backup)
					return h
				},
			})
		})
	}
}

// A log restored in place under several stores: each one that knows the
// lost history (one published it, another opened the log after it) never
// reissues its sequences, whichever way it publishes: Publish, InTx, or
// PublishTx in a transaction the application began itself.
func TestRestoreInPlaceEveryWriter(t *testing.T) {
	orig, backup := filepath.Join(t.TempDir(), "log.db"), filepath.Join(t.TempDir(), "backup.db")
	a := openHub(t, orig, replayd.Options{})
	publish := func(h *replayd.EventHub, what string) int64 {
		t.Helper()
		ev, err := h.Publish(t.Context(), "", what)
		if err != nil {
			t.Fatal(err)
		}
		return ev.Sequence
	}
	publish(a, "kept")
	sqlitetest.VacuumInto(t, orig, backup)
	var lost []int64
	for range 5 {
		lost = append(lost, publish(a, "lost"))
	}
	db, err := replayd.OpenDB(orig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b, err := replayd.New(db, replayd.Options{}) // opened after the lost history: its floor is above it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	highest, err := b.LatestSequence(t.Context()) // at or above lost[4]
	if err != nil {
		t.Fatal(err)
	}
	url := wiretest.ServePoll(t, a)

	for _, w := range []struct {
		name    string
		publish func() int64
	}{
		{"Publish on the store that published the lost history", func() int64 { return publish(a, "new") }},
		{"Publish on a store opened after it", func() int64 { return publish(b, "new") }},
		{"InTx", func() int64 {
			var seq int64
			err := b.InTx(t.Context(), func(tx *sql.Tx) error {
				ev, err := b.PublishTx(t.Context(), tx, "", "new")
				seq = ev.Sequence
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			return seq
		}},
		{"PublishTx in the application's transaction", func() int64 {
			tx, err := db.BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			ev, err := b.PublishTx(t.Context(), tx, "", "new")
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			return ev.Sequence
		}},
	} {
		sqlitetest.RestoreInPlace(t, orig, backup)
		if seq := w.publish(); seq <= highest {
			t.Fatalf("%s after a restore in place: sequence %d, at or below %d, which the log had issued", w.name, seq, highest)
		} else {
			highest = seq
		}
		if p := wiretest.Poll(t, url, fmt.Sprintf("cursor=%d", lost[4])); p.Gap == nil || p.Gap.Reason != "unknown_cursor" || len(p.Events) != 0 {
			t.Fatalf("%s: polling from the lost history's %d: %+v, want an unknown_cursor gap", w.name, lost[4], p)
		}
	}
}

// restoreRowsCopiedBack replaces every table of the log at path with
// backup's, sqlite_sequence's row included, in one transaction.
func restoreRowsCopiedBack(t testing.TB, path, backup string) {
	t.Helper()
	db, err := replayd.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	if _, err := conn.ExecContext(ctx, `ATTACH DATABASE ? AS backup`, backup); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE;
		DELETE FROM main.events; INSERT INTO main.events SELECT * FROM backup.events;
		DELETE FROM main.events_prune_watermarks; INSERT INTO main.events_prune_watermarks SELECT * FROM backup.events_prune_watermarks;
		DELETE FROM main.events_skips; INSERT INTO main.events_skips SELECT * FROM backup.events_skips;
		UPDATE main.sqlite_sequence SET seq = (SELECT seq FROM backup.sqlite_sequence WHERE name = 'events') WHERE name = 'events';
		COMMIT`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `DETACH DATABASE backup`); err != nil {
		t.Fatal(err)
	}
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
