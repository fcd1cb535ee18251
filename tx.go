package replayd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/replayd/replayd/internal/event"
	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/storage"
)

// Publishing inside the application's own transaction, on the hub's SQLite
// database (docs/transactions.md). The store appends the row in the
// transaction (storage.TxAppender); the hub delivers it once committed:
// InTx, which commits, delivers at once; a transaction the application
// commits itself is watched (watchCommit) while it is open, and after it
// ends until its row shows in the log.

// txPublisher is the hub's state for transactional publishing.
type txPublisher struct {
	mu sync.Mutex
	// owned holds InTx's transactions, with the events published in each.
	owned map[*sql.Tx]*[]Event
	// The watch of transactions the application commits: the highest
	// sequence published in one, those of them not yet seen to end, until
	// when to look for their rows once none is open, whether the watch's
	// goroutine runs, and a nudge that shortens its interval.
	target   int64
	open     map[*sql.Tx]struct{}
	until    time.Time
	watching bool
	kick     chan struct{}
}

// txWatchFor is how long the watch goes on looking for rows published in
// transactions the application commits itself once it has seen the last
// of them end (the commit is visible a moment after database/sql marks the
// transaction done; a rolled-back one's rows never show); txWatchMax is its
// longest interval. A variable for tests.
var txWatchFor = 30 * time.Second

const txWatchMax = 100 * time.Millisecond

// InTx runs fn inside a transaction on the hub's SQLite database and
// commits it if fn returns nil, else rolls it back and returns fn's error.
// Events published in it with PublishTx are in the log if and only if it
// commits; InTx delivers them to this hub's live subscribers before it
// returns (other hubs on the file, through their tails). See
// docs/transactions.md.
//
//	err := hub.InTx(ctx, func(tx *sql.Tx) error {
//		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'shipped' WHERE id = ?`, 42); err != nil {
//			return err
//		}
//		_, err := hub.PublishTx(ctx, tx, "orders", order, replayd.WithEventID("order-42-shipped"))
//		return err
//	})
//
// The transaction takes SQLite's write lock when it begins: SQLite has one
// writer, so every other write to the file, this hub's Publish included,
// waits until it ends. Keep it short, and never call Publish inside fn
// (it would wait for fn's own transaction, until the busy timeout fails it).
// ctx bounds the whole transaction: once it ends, database/sql rolls it
// back. A hub over a store that is not a [storage.TxAppender] (PostgreSQL:
// use replaydpg's Store.PublishSQLTx) returns an error wrapping
// errors.ErrUnsupported.
func (h *EventHub) InTx(ctx context.Context, fn func(tx *sql.Tx) error) (err error) {
	ta, err := h.txAppender()
	if err != nil {
		return err
	}
	tx, err := ta.BeginTx(ctx)
	if err != nil {
		return fmt.Errorf("replayd: begin a transaction: %w", err)
	}
	var evs []Event
	t := &h.txp
	t.mu.Lock()
	if t.owned == nil {
		t.owned = make(map[*sql.Tx]*[]Event)
	}
	t.owned[tx] = &evs
	t.mu.Unlock()
	ended := false
	defer func() {
		if !ended {
			tx.Rollback()
		}
		t.mu.Lock()
		delete(t.owned, tx)
		t.mu.Unlock()
	}()
	if err := fn(tx); err != nil {
		return err
	}
	cerr := tx.Commit()
	ended = true
	t.mu.Lock()
	fresh := append([]Event(nil), evs...)
	t.mu.Unlock()
	if cerr != nil {
		if n := len(fresh); n > 0 {
			// Whatever the commit did, the watch delivers what is there.
			h.watchCommit(nil, fresh[n-1].Sequence)
		}
		return fmt.Errorf("replayd: commit: %w", cerr)
	}
	h.metrics.publishedEvents(len(fresh))
	h.deliverCommitted(fresh)
	return nil
}

// PublishTx publishes an event inside tx, a transaction on the hub's
// SQLite database (from InTx, or one the application began on the *sql.DB
// it gave New): the event is in the log if and only if tx commits. The
// arguments, their checks (ErrInvalid, before anything is written), the
// type (Options.DefaultType unless WithType), the event id and its
// idempotency are Publish's: an id already in the log, as tx sees it,
// stores nothing and returns the stored event. Otherwise the returned event
// holds the sequence and CreatedAt it will have once committed.
//
// Within InTx, the event is delivered when InTx commits. In a transaction
// the application commits itself, the hub watches the log, at intervals
// from 1 ms up to 100 ms, for as long as tx is open and up to 30 s after
// it ends, and delivers the event to its live subscribers as soon as the
// commit shows: within about 100 ms of the commit, however late it comes.
// Other hubs on the file deliver it through their tails.
//
// A PublishTx refused for its arguments (ErrInvalid) writes nothing, and tx
// goes on; after any other error, roll tx back. A transaction the
// application begins itself with db.BeginTx is deferred: it takes the write
// lock at its first write, and if it read before, another writer's commit
// in between makes that write fail with SQLITE_BUSY at once. Write first,
// or use InTx, which takes the lock when it begins.
func (h *EventHub) PublishTx(ctx context.Context, tx *sql.Tx, topic string, payload any, opts ...PublishOption) (Event, error) {
	ta, err := h.txAppender()
	if err != nil {
		return Event{}, err
	}
	po := event.Options{Type: h.opts.DefaultType}
	for _, o := range opts {
		o(&po)
	}
	ev, err := event.Prepare(topic, payload, po)
	if err != nil {
		return Event{}, err
	}
	res, err := ta.AppendTx(ctx, tx, []Event{ev})
	if err == nil && len(res) != 1 {
		err = fmt.Errorf("the store returned %d results for 1 event", len(res))
	}
	if err == nil {
		err = res[0].Err
	}
	if err != nil {
		return Event{}, fmt.Errorf("replayd: publish in a transaction: %w", err)
	}
	r := res[0]
	if r.Duplicate {
		h.metrics.duplicate()
		return r.Event, nil
	}
	t := &h.txp
	t.mu.Lock()
	if evs, ok := t.owned[tx]; ok {
		*evs = append(*evs, r.Event)
		t.mu.Unlock()
		return r.Event, nil
	}
	t.mu.Unlock()
	h.watchCommit(tx, r.Event.Sequence)
	return r.Event, nil
}

// txAppender returns the hub's store as a storage.TxAppender, or why not.
func (h *EventHub) txAppender() (storage.TxAppender, error) {
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	ta, ok := h.store.(storage.TxAppender)
	if !ok {
		return nil, fmt.Errorf("replayd: publish in a transaction: the hub's store (%T) cannot append in an application's *sql.Tx: %w", h.store, errors.ErrUnsupported)
	}
	return ta, nil
}

// deliverCommitted delivers the events InTx committed. One transaction's
// rows are consecutive (no other writer commits between them): delivered
// as the writer delivers its batch; else read back from the log.
func (h *EventHub) deliverCommitted(evs []Event) {
	n := len(evs)
	if n == 0 {
		return
	}
	for i := 1; i < n; i++ {
		if evs[i].Sequence != evs[i-1].Sequence+1 {
			h.live.Deliver(evs[n-1].Sequence, nil, false)
			return
		}
	}
	h.live.Deliver(evs[0].Sequence-1, evs, false)
}

// watchCommit makes the watch look for rows up to seq, published in tx, a
// transaction the application commits itself (nil: one already ended),
// starting its goroutine if it is not running.
func (h *EventHub) watchCommit(tx *sql.Tx, seq int64) {
	t := &h.txp
	t.mu.Lock()
	defer t.mu.Unlock()
	t.target = max(t.target, seq)
	t.until = time.Now().Add(txWatchFor)
	if tx != nil {
		if t.open == nil {
			t.open = make(map[*sql.Tx]struct{})
		}
		t.open[tx] = struct{}{}
	}
	if t.watching {
		select {
		case t.kick <- struct{}{}:
		default:
		}
		return
	}
	if t.kick == nil {
		t.kick = make(chan struct{}, 1)
	}
	if h.goLoop(h.watchLoop) == nil {
		t.watching = true
	}
}

// watchLoop reads the head at growing intervals, from 1 ms (again after
// each new publish, and once a watched transaction is seen to end) up to
// txWatchMax, and delivers through live delivery's one path whatever the
// head shows above the live position. It stops when the live position has
// reached the watched sequence, when no watched transaction is open and
// txWatchFor has passed since the last one ended (or the last publish),
// or at Close. A transaction's commit may come at any time, so the watch
// never gives up on one still open. A rolled-back transaction's sequence
// may be taken again by another row: the watch then delivers that row, as
// the tail would.
func (h *EventHub) watchLoop() {
	t := &h.txp
	wait := time.Millisecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var open []*sql.Tx
	for {
		select {
		case <-h.ctx.Done():
			t.mu.Lock()
			t.watching = false
			t.open = nil
			t.mu.Unlock()
			return
		case <-t.kick:
			wait = time.Millisecond
			timer.Reset(wait)
			continue
		case <-timer.C:
		}
		// Which watched transactions ended, looked at outside t.mu (see
		// txEnded).
		t.mu.Lock()
		open = open[:0]
		for tx := range t.open {
			open = append(open, tx)
		}
		t.mu.Unlock()
		var ended []*sql.Tx
		for _, tx := range open {
			if txEnded(tx) {
				ended = append(ended, tx)
			}
		}
		clear(open)
		ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
		head, err := h.store.Head(ctx)
		cancel()
		if err == nil && head > h.live.Position() {
			for {
				n, _, err := h.live.Deliver(head, nil, true)
				if err != nil || n < live.CatchUpPage {
					break
				}
			}
		}
		pos := h.live.Position()
		t.mu.Lock()
		for _, tx := range ended {
			delete(t.open, tx)
		}
		if len(t.open) > 0 {
			t.until = time.Now().Add(txWatchFor)
		}
		if pos >= t.target || time.Now().After(t.until) {
			t.watching = false
			t.open = nil
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		if len(ended) > 0 {
			// Its commit, if it committed, shows in a moment.
			wait = time.Millisecond
		} else {
			wait = min(2*wait, txWatchMax)
		}
		timer.Reset(wait)
	}
}

// txEnded reports whether tx has been committed or rolled back, without
// touching its connection: database/sql answers sql.ErrTxDone to any call
// on an ended transaction, and on an open one refuses a statement of no
// database before doing anything (TestTxEnded pins both). It waits only
// while a Commit or Rollback of tx waits for tx's running statements.
func txEnded(tx *sql.Tx) bool {
	return errors.Is(tx.StmtContext(context.Background(), new(sql.Stmt)).Close(), sql.ErrTxDone)
}
