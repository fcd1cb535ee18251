package replaydpg

// Publishing inside the application's own transaction: an outbox in the
// application's transaction, and a relay in every Store that moves it
// into the log (relay.go).
//
// PublishTx and PublishSQLTx insert the event into prefix+"outbox" in the
// application's transaction. They take no lock but the row's own, so a
// transaction left open for seconds holds up no publisher, and they write
// nothing to the log, so a reader can never see a sequence before a lower
// one commits: the log's sequences are still assigned only under the
// head row's lock (see Store).
//
// They issue no NOTIFY: a transaction that notifies holds PostgreSQL's
// notification lock from its pre-commit to the end of its commit, so all
// such commits in the database are serialised, WAL flush included, where
// plain ones share flushes (BenchmarkPublishTxConcurrent: 64 application
// transactions committed 4.3 times slower with a NOTIFY each). Instead
// PublishTx hands the transaction's id to its store's relay, which asks
// the server for its status (pg_xact_status) after 1 ms, then at doubling
// intervals up to relayWatchMax, until it has committed or aborted, and
// relays at once on a commit. A process that dies before its relay did
// leaves the rows to the sweep.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/internal/event"
)

const (
	// qTxPublish runs in the application's transaction: $1..$4 the event's
	// id, type, topic (NULL: broadcast) and payload. Unless the event id is
	// in the log already (as the transaction sees it), it inserts the
	// event into the outbox and returns the transaction's id. One plain
	// statement: as a CTE returning the stored event in the same round
	// trip it cost a third more (planning).
	qTxPublish = `INSERT INTO %[1]soutbox (event_id, type, topic, payload)
		SELECT $1::text, $2::text, $3::text, $4::text
		WHERE NOT EXISTS (SELECT 1 FROM %[1]sevents e WHERE e.event_id = $1::text)
		RETURNING pg_current_xact_id()::text`

	// qTxStored: the stored event of id $1, when qTxPublish inserted
	// nothing.
	qTxStored = `SELECT e.sequence, e.type, e.topic, e.payload, e.created_at FROM %[1]sevents e WHERE e.event_id = $1`
)

// PublishTx publishes an event inside the application's transaction tx,
// which must be on this store's database: the event is in the log if and
// only if tx commits. Nothing else is needed after the commit: this
// store's relay sees the commit within milliseconds and moves the event
// into the log, and every hub tailing the log (StartTail, needed even on
// a single node) delivers it, on every node, as it delivers another
// node's events. If this process dies
// first, any node's relay moves it within a second (or the first Store
// opened on the log, if none is running).
//
//	ev, err := store.PublishTx(ctx, tx, "orders", order)
//
// The arguments are Publish's and are checked as Publish checks them (by
// the same code), with a payload PostgreSQL would refuse refused too
// (ErrInvalid), before anything is sent; the type is "message" unless
// replayd.WithType gives one (a hub's Options.DefaultType does not apply
// here). The returned event holds its event id (a fresh UUIDv7 unless
// replayd.WithEventID gives one), type, topic and payload, and no
// Sequence or CreatedAt: the relay assigns them after the commit. If the
// event id is already in the log, as tx sees it, PublishTx stores nothing
// and returns the stored event, Sequence included. Idempotency by event
// id holds across PublishTx, PublishSQLTx and the hub's Publish: an event
// id is stored once, whichever path stored it first.
//
// It takes no lock that a publisher or a reader waits for, so tx may stay
// open as long as the application needs. If tx rolls back (or its
// session dies before the commit), nothing is stored, delivered or
// counted in a gap. An error leaves tx as any failed statement does
// (aborted): roll it back. It needs PostgreSQL 13 or later
// (pg_current_xact_id).
func (s *Store) PublishTx(ctx context.Context, tx pgx.Tx, topic string, payload any, opts ...replayd.PublishOption) (replayd.Event, error) {
	ev, topicArg, err := s.txEvent(topic, payload, opts)
	if err != nil {
		return replayd.Event{}, err
	}
	var xid string
	err = tx.QueryRow(ctx, s.q.txPublish, ev.EventID, ev.Type, topicArg, string(ev.Payload)).Scan(&xid)
	if err == nil {
		s.watch(xid)
		return ev, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return replayd.Event{}, fmt.Errorf("replaydpg: publish in a transaction: %w", err)
	}
	var st storedRow
	err = tx.QueryRow(ctx, s.q.txStored, ev.EventID).Scan(&st.seq, &st.typ, &st.topic, &st.payload, &st.created)
	if err != nil {
		return replayd.Event{}, fmt.Errorf("replaydpg: publish in a transaction: the event id is stored: %w", err)
	}
	return st.event(ev), nil
}

// PublishSQLTx is PublishTx for a database/sql transaction opened through
// pgx's stdlib (github.com/jackc/pgx/v5/stdlib) on this store's database.
func (s *Store) PublishSQLTx(ctx context.Context, tx *sql.Tx, topic string, payload any, opts ...replayd.PublishOption) (replayd.Event, error) {
	ev, topicArg, err := s.txEvent(topic, payload, opts)
	if err != nil {
		return replayd.Event{}, err
	}
	var xid string
	err = tx.QueryRowContext(ctx, s.q.txPublish, ev.EventID, ev.Type, topicArg, string(ev.Payload)).Scan(&xid)
	if err == nil {
		s.watch(xid)
		return ev, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return replayd.Event{}, fmt.Errorf("replaydpg: publish in a transaction: %w", err)
	}
	var (
		seq                 sql.NullInt64
		typ, top, payloadNS sql.NullString
		created             sql.NullTime
	)
	err = tx.QueryRowContext(ctx, s.q.txStored, ev.EventID).Scan(&seq, &typ, &top, &payloadNS, &created)
	if err != nil {
		return replayd.Event{}, fmt.Errorf("replaydpg: publish in a transaction: the event id is stored: %w", err)
	}
	st := storedRow{typ: nullString(typ), topic: nullString(top), payload: nullString(payloadNS)}
	if seq.Valid {
		st.seq = &seq.Int64
	}
	if created.Valid {
		st.created = &created.Time
	}
	return st.event(ev), nil
}

// txEvent checks an event for PublishTx: Publish's checks (the root
// module's internal/event: the options applied over its DefaultType, then
// event.Prepare), then PostgreSQL's text. topicArg is the topic as a query argument (nil: a
// broadcast).
func (s *Store) txEvent(topic string, payload any, opts []replayd.PublishOption) (ev replayd.Event, topicArg any, err error) {
	if s.isClosed() {
		return ev, nil, ErrClosed
	}
	o := event.Options{Type: event.DefaultType}
	for _, opt := range opts {
		opt(&o)
	}
	ev, err = event.Prepare(topic, payload, o)
	if err != nil {
		return ev, nil, err
	}
	if err := checkText(ev); err != nil {
		return replayd.Event{}, nil, err
	}
	if ev.Topic != "" {
		topicArg = ev.Topic
	}
	return ev, topicArg, nil
}

// storedRow is qTxStored's answer.
type storedRow struct {
	seq                 *int64
	typ, topic, payload *string
	created             *time.Time
}

func nullString(ns sql.NullString) *string {
	if !ns.Valid {
		return nil
	}
	return &ns.String
}

// event returns ev as published into the outbox, or the stored event.
func (st storedRow) event(ev replayd.Event) replayd.Event {
	if st.seq == nil || st.typ == nil || st.payload == nil || st.created == nil {
		return ev
	}
	out := replayd.Event{Sequence: *st.seq, EventID: ev.EventID, Type: *st.typ, Payload: []byte(*st.payload), CreatedAt: *st.created}
	if st.topic != nil {
		out.Topic = *st.topic
	}
	return out
}
