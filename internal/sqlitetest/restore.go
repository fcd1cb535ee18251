package sqlitetest

import (
	"database/sql"
	"errors"
	"net/url"
	"testing"

	"modernc.org/sqlite"
)

// open opens the database file at path on a pool of its own, as another
// process would, waiting up to 10 s for another writer's lock.
func open(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// VacuumInto writes a consistent copy of the database at path to backup
// (VACUUM INTO), as an operator's backup of a running log.
func VacuumInto(t testing.TB, path, backup string) {
	t.Helper()
	db := open(t, path)
	defer db.Close()
	if _, err := db.Exec(`VACUUM INTO ?`, backup); err != nil {
		t.Fatalf("VACUUM INTO %s: %v", backup, err)
	}
}

// RestoreInPlace copies backup over the database at path, in place, with
// SQLite's online-backup API on a connection of its own (what sqlite3's
// ".restore" does), while other connections keep the file open.
func RestoreInPlace(t testing.TB, path, backup string) {
	t.Helper()
	db := open(t, path)
	defer db.Close()
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		r, ok := dc.(interface {
			NewRestore(string) (*sqlite.Backup, error)
		})
		if !ok {
			return errors.New("the driver's connection has no NewRestore")
		}
		b, err := r.NewRestore(backup)
		if err != nil {
			return err
		}
		for more := true; more; { // Step(-1) copies every page at once
			if more, err = b.Step(-1); err != nil {
				b.Finish()
				return err
			}
		}
		return b.Finish()
	})
	if err != nil {
		t.Fatalf("restore %s over %s: %v", backup, path, err)
	}
}
