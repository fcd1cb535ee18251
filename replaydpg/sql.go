package replaydpg

import "strings"

// qProbe is the first statement of ProbeWrite's pipeline (one implicit
// transaction, qLock after it). For that transaction only, it sets $1 as
// lock_timeout, and synchronous_commit off: the transaction writes nothing,
// it only holds the head row's lock until its commit, which then need not
// wait for a WAL flush. Its third column tells whether the server accepts
// writes.
const qProbe = `SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true),
	NOT pg_is_in_recovery() AND current_setting('default_transaction_read_only') = 'off'`

// render substitutes the table prefix into a query.
func render(q, prefix string) string {
	return strings.ReplaceAll(q, "%[1]s", prefix)
}
