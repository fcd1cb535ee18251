// Package sqlitestore is replayd's SQLite log: a [storage.Store] over a
// SQLite database opened with [OpenDB] (modernc.org/sqlite, pure Go, no
// cgo). It is a peer of the PostgreSQL store (module
// github.com/replayd/replayd/replaydpg): it imports only the storage
// contract, never the hub, and passes the same kits.
//
// Most applications never name it: replayd.New(db, opts) opens this store
// over db and closes it with the hub, and replayd.OpenDB and
// replayd.NewSQLiteStore are this package's OpenDB and Open. Use it
// directly to hold the store yourself, for replayd.NewWithStore:
//
//	db, err := sqlitestore.OpenDB("events.db")
//	s, err := sqlitestore.Open(db, sqlitestore.Options{Logger: logger})
//	hub, err := replayd.NewWithStore(s, replayd.Options{})
//	// ... hub.Close(), then s.Close(), then db.Close()
//
// One table holds every event, its sequence the SQLite rowid (AUTOINCREMENT),
// with each row's ordinal in the log and in its topic, so that counting a
// scope's events in a range costs a few index probes; a tiny table holds
// the prune watermarks, another the sequence floor's skipped ranges. The
// store serialises its own writes; several stores, in one process or
// several, may share one database file.
package sqlitestore
