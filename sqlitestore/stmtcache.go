package sqlitestore

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCache keeps the SQLite store's read statements prepared. SQLite has
// no statement cache of its own, and a scope's UNION ALL query costs more
// to prepare than to run near the head: preparing from SQL text took about
// a third of a poll's server time. A *sql.Stmt prepared on the *sql.DB is
// prepared again on each pooled connection the first time it runs there,
// then reused; a read transaction uses it through Tx.StmtContext, which
// reuses the connection's prepared statement too.
//
// A statement is prepared only between transactions: preparing on the
// *sql.DB takes a pooled connection, and a transaction waiting for a second
// connection while holding one could wait for a pool the handshake slots
// keep nearly full.
type stmtCache struct {
	stmts sync.Map // query text -> *sql.Stmt
}

func (c *stmtCache) load(query string) *sql.Stmt {
	if st, ok := c.stmts.Load(query); ok {
		return st.(*sql.Stmt)
	}
	return nil
}

// prepare prepares the queries not cached yet; errors are left to the
// next read that runs them.
func (c *stmtCache) prepare(ctx context.Context, db *sql.DB, queries []string) {
	for _, q := range queries {
		if c.load(q) != nil {
			continue
		}
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			return
		}
		if _, loaded := c.stmts.LoadOrStore(q, st); loaded {
			st.Close()
		}
	}
}

// close closes every statement, each after it has left the cache. A read
// transaction still running with one prepares it again on its connection
// (see Tx.StmtContext); a read outside one runs it from its text (see
// queryWith).
func (c *stmtCache) close() {
	c.stmts.Range(func(q, st any) bool {
		c.stmts.Delete(q)
		st.(*sql.Stmt).Close()
		return true
	})
}

// query runs query on db outside a transaction, with the cached statement
// if there is one; prepared false means there was none, and the caller
// prepares it (prepare) once the rows are closed.
func (c *stmtCache) query(ctx context.Context, db *sql.DB, query string, args ...any) (rows *sql.Rows, prepared bool, err error) {
	return c.queryWith(ctx, db, c.load(query), query, args...)
}

// queryWith runs query with st, the statement load found (or nil). A
// statement closed since (close, when the store closes) has left the cache
// first: then query runs from its text, so reads keep working after Close.
func (c *stmtCache) queryWith(ctx context.Context, db *sql.DB, st *sql.Stmt, query string, args ...any) (rows *sql.Rows, prepared bool, err error) {
	if st != nil {
		rows, err = st.QueryContext(ctx, args...)
		if err == nil || c.load(query) == st {
			return rows, true, err
		}
	}
	rows, err = db.QueryContext(ctx, query, args...)
	return rows, false, err
}

// cachedTx is a read transaction whose queries use the cache's statements,
// noting the ones it had to run from text.
type cachedTx struct {
	c       *stmtCache
	tx      *sql.Tx
	missing []string
}

func (q *cachedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := q.c.load(query); st != nil {
		return q.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	q.missing = append(q.missing, query)
	return q.tx.QueryContext(ctx, query, args...)
}

func (q *cachedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := q.c.load(query); st != nil {
		return q.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	q.missing = append(q.missing, query)
	return q.tx.QueryRowContext(ctx, query, args...)
}
