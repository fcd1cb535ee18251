package chaostest

// Transactional publishers (Config.Transactions): events published inside
// a transaction on hub A's database, committed or rolled back.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/replayd/replayd"
)

// errRollback makes InTx roll back.
var errRollback = errors.New("chaostest: roll back")

// publishTx publishes one or two events on hub A inside one InTx and rolls
// it back one time in three. A committed event is in the ledger like any
// publish; a rolled-back one is not, so Check fails the run if it shows up
// in the log or on any client.
func (e *env) publishTx(p, n int, rng *rand.Rand, topic string, payload any, opts []replayd.PublishOption) {
	rollback := rng.IntN(3) == 0
	count := 1 + rng.IntN(2)
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	var evs []replayd.Event
	err := e.hubA.InTx(ctx, func(tx *sql.Tx) error {
		for i := range count {
			o := opts
			if i > 0 { // the second event is a fresh one
				o = []replayd.PublishOption{replayd.WithEventID(fmt.Sprintf("tx%d-%d-%d", p, n, i))}
			}
			ev, err := e.hubA.PublishTx(ctx, tx, topic, payload, o...)
			if err != nil {
				return err
			}
			evs = append(evs, ev)
		}
		if rollback {
			return errRollback
		}
		return nil
	})
	switch {
	case rollback && errors.Is(err, errRollback):
		e.stats.txRollbacks.Add(1)
	case err != nil:
		e.t.Errorf("publish in a transaction on hub A: %v", err)
	default:
		e.stats.txCommits.Add(1)
		for _, ev := range evs {
			e.ledger.Published(ev)
		}
	}
}
