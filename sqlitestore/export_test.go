package sqlitestore

// Exported to this package's black-box tests (package sqlitestore_test),
// which run a replayd hub over the store, only: test files are not part of
// the package.

// SetTestHookHandshake sets a function run inside each Window read
// transaction of s, holding its pooled connection; nil: none. Set it
// while no Window runs.
func SetTestHookHandshake(s *Store, f func()) { s.testHookHandshake = f }

// WriteLocked reports whether s's write mutex is held (by an append
// waiting for SQLite's lock, say).
func WriteLocked(s *Store) bool {
	if s.writeMu.TryLock() {
		s.writeMu.Unlock()
		return false
	}
	return true
}
