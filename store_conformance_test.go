package replayd_test

import (
	"io"
	"testing"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storetest"
)

// The SQLite store keeps the storage contract: each subtest gets a new
// database file, and each store on it its own *sql.DB, as another process
// would.
func TestSQLiteStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() replayd.Store {
		path := t.TempDir() + "/log.db"
		return func() replayd.Store {
			db, err := replayd.OpenDB(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := replayd.NewSQLiteStore(db)
			if err != nil {
				db.Close()
				t.Fatal(err)
			}
			t.Cleanup(func() {
				s.(io.Closer).Close()
				db.Close()
			})
			return s
		}
	})
}
