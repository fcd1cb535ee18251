package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLogReplaced is wrapped by the error of every Publish after the hub
// found that the database file at its path is no longer the one it opened:
// the file was deleted, or another file was moved over it. Rows committed
// now would go into a file that no process will open again (or, through
// the old -wal, corrupt the new one). Nothing was stored; the hub will not
// recover: close it and the *sql.DB, put the right file in place, and open
// both again.
var ErrLogReplaced = errors.New("replayd: the database file was deleted or replaced under the hub")

// fileCheckInterval bounds how often the writer looks at the file before
// a commit: a stat (about a microsecond), at most once per interval, so
// publishes acknowledged into a deleted file span at most about this long.
const fileCheckInterval = 100 * time.Millisecond

// fileGuard detects that the main database file at the path SQLite reports
// is no longer the file opened (device and inode on Unix, see os.SameFile).
type fileGuard struct {
	path   string      // "": nothing to check (":memory:", a temp database)
	opened os.FileInfo // the file as found when the hub was created

	lastCheck atomic.Int64 // unix nanoseconds of the last periodic check
	mu        sync.Mutex   // guards a check (stat, then err set once), so the Error log is one
	err       atomic.Pointer[error]
}

// newFileGuard finds the main database's path with PRAGMA database_list
// and remembers the file there. A database without a file, or whose file
// cannot be found, gets a guard that checks nothing.
func newFileGuard(ctx context.Context, db *sql.DB) (*fileGuard, error) {
	rows, err := db.QueryContext(ctx, "PRAGMA database_list")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	g := &fileGuard{}
	for rows.Next() {
		var seq int
		var name, file string
		if err := rows.Scan(&seq, &name, &file); err != nil {
			return nil, err
		}
		if name == "main" {
			g.path = file
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if g.path != "" {
		if g.opened, err = os.Stat(g.path); err != nil {
			g.path = ""
		}
	}
	return g, nil
}

// check returns whether this call found the file at the path not to be
// the one opened, and the guard's error once any call did; if !force it
// stats the file only when fileCheckInterval has passed since the last
// check.
func (g *fileGuard) check(force bool) (found bool, err error) {
	if p := g.err.Load(); p != nil {
		return false, *p
	}
	if g.path == "" {
		return false, nil
	}
	now := time.Now().UnixNano()
	if !force && now-g.lastCheck.Load() < int64(fileCheckInterval) {
		return false, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.err.Load(); p != nil {
		return false, *p
	}
	g.lastCheck.Store(now)
	fi, statErr := os.Stat(g.path)
	switch {
	case errors.Is(statErr, os.ErrNotExist):
		err = fmt.Errorf("%w: %s is gone", ErrLogReplaced, g.path)
	case statErr != nil:
		return false, nil // cannot tell (permissions, I/O): keep going
	case !os.SameFile(g.opened, fi):
		err = fmt.Errorf("%w: %s is another file now", ErrLogReplaced, g.path)
	default:
		return false, nil
	}
	stored := err // only this path allocates: &err would make every call do so
	g.err.Store(&stored)
	return true, err
}

// checkFile returns an error wrapping ErrLogReplaced once the database
// file was deleted or replaced, and logs that at Error the first time.
// Without force it looks at the file at most once per fileCheckInterval.
func (s *Store) checkFile(force bool) error {
	if s.file == nil {
		return nil
	}
	found, err := s.file.check(force)
	if found && s.logger != nil {
		s.logger.Error("replayd: the database file was deleted or replaced under the hub; every publish is refused. "+
			"Close the hub and the *sql.DB, put the right file in place and open them again",
			"path", s.file.path, "err", err)
	}
	return err
}
