package sqlitestore_test

import (
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storetest"
)

// The SQLite store keeps the storage contract: each subtest gets a new
// database file, and each store on it its own *sql.DB, as another process
// would. (The hub over it runs hubtest and chaostest in the root package,
// through replayd.New.)
func TestSQLiteStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() replayd.Store {
		path := t.TempDir() + "/log.db"
		return func() replayd.Store {
			db, err := sqlitestore.OpenDB(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := sqlitestore.Open(db, sqlitestore.Options{})
			if err != nil {
				db.Close()
				t.Fatal(err)
			}
			t.Cleanup(func() {
				s.Close()
				db.Close()
			})
			return s
		}
	})
}
