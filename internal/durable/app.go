package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/replayd/replayd/storage"
)

// A hook for Go code that keeps streams of its own (internal/jobs: job
// streams, SPEC §20) inside the stream transactions of the protocol, so
// that its streams are Durable Streams like any other: created with a
// ds.create marker, read by every reader of the protocol, closed with a
// ds.close marker, expired and reclaimed by the sweep. The code's own
// state rides in the stream's record (meta.App), which the protocol keeps
// and never reads. A stream created through AppTx is application/json.

// ErrExpired is Create's over a stream that expired and is not buried
// yet: bury it with Sweeper.BuryExpired (outside the transaction), then
// create again.
var ErrExpired = errExpired

// ErrExists is Create's over a stream that is alive.
var ErrExists = errors.New("replayd: durable streams: the stream exists")

// ErrNoStream is Append's and Set's when the stream is not alive.
var ErrNoStream = errors.New("replayd: durable streams: no such stream")

// AppStream is what AppTx.Get and AppOf tell of an alive stream.
type AppStream struct {
	App    json.RawMessage // the Go code's state, as it was stored
	Base   int64           // the ds.create marker's sequence
	Closed bool
	Tail   int64 // the offset of the stream's end, when Closed (else 0)
}

// AppTx is a stream transaction for Go code: wrap the storage.StreamTx of
// a StreamStore.UpdateStreams, then deliver Events() once it committed.
//
// It reads and decodes a stream's record once: what it read, and what it
// wrote since, is kept (metas) for the rest of the transaction, which is
// the only writer of the record until it commits (UpdateStreams
// serialises per topic). So Get, Append and Set of one stream cost one
// read, and Prefetch reads the records of many streams in one.
type AppTx struct {
	t        *txn
	dataType string
	metas    map[string]*meta // by topic: the record as the transaction has it (nil: none)
}

// NewAppTx wraps tx, running at now; data events get the type dataType
// (the hub's default event type, as the protocol's data events).
func NewAppTx(tx storage.StreamTx, now time.Time, dataType string) *AppTx {
	return &AppTx{t: &txn{StreamTx: tx, now: now}, dataType: dataType, metas: map[string]*meta{}}
}

// stream is txn.stream through the transaction's records.
func (a *AppTx) stream(ctx context.Context, topic string) (*meta, state, error) {
	m, ok := a.metas[topic]
	if !ok {
		var err error
		if m, _, err = a.t.stream(ctx, topic); err != nil {
			return nil, absent, err
		}
		a.metas[topic] = m
	}
	if m == nil {
		return nil, absent, nil
	}
	return m, m.state(a.t.now), nil
}

// put stores m as topic's record.
func (a *AppTx) put(ctx context.Context, topic string, m *meta) error {
	a.metas[topic] = m
	return a.t.put(ctx, topic, m)
}

// Prefetch reads the records of topics not read yet, in one statement
// when the store's transaction can (storage.StreamsReader); else they are
// read one by one as they are needed.
func (a *AppTx) Prefetch(ctx context.Context, topics []string) error {
	sr, ok := a.t.StreamTx.(storage.StreamsReader)
	if !ok {
		return nil
	}
	var want []string
	for _, topic := range topics {
		if _, ok := a.metas[topic]; !ok {
			want = append(want, topic)
		}
	}
	if len(want) == 0 {
		return nil
	}
	recs, err := sr.Streams(ctx, want)
	if err != nil {
		return err
	}
	for _, topic := range want {
		a.metas[topic] = nil
	}
	for _, rec := range recs {
		if _, ok := a.metas[rec.Topic]; !ok {
			return fmt.Errorf("replayd: durable streams: the store returned the record of %q, not asked for", rec.Topic)
		}
		m, err := decodeMeta(rec)
		if err != nil {
			return err
		}
		a.metas[rec.Topic] = m
	}
	return nil
}

// Now is the transaction's time, in Unix ms.
func (a *AppTx) Now() int64 { return a.t.now.UnixMilli() }

// Events are the events appended so far, to deliver after the commit.
func (a *AppTx) Events() []storage.Event { return a.t.events }

// Get returns the stream of topic if it is alive, else nil.
func (a *AppTx) Get(ctx context.Context, topic string) (*AppStream, error) {
	m, st, err := a.stream(ctx, topic)
	if err != nil || st != alive {
		return nil, err
	}
	return appStream(m), nil
}

func appStream(m *meta) *AppStream {
	s := &AppStream{App: m.App, Base: m.Base, Closed: m.Closed}
	if m.Closed {
		s.Tail = m.ClosedAt
	}
	return s
}

// AppOf decodes rec (a storage.StreamPage's Record) at now: nil when the
// stream is not alive.
func AppOf(rec storage.StreamRecord, now time.Time) (*AppStream, error) {
	m, err := decodeMeta(rec)
	if err != nil || m.state(now) != alive {
		return nil, err
	}
	return appStream(m), nil
}

// Create creates the stream of topic (application/json) holding app,
// expiring at expires (Unix ms; 0: never). ErrExists when one is alive,
// ErrExpired when an expired one awaits the sweep.
func (a *AppTx) Create(ctx context.Context, topic string, app json.RawMessage, expires int64) error {
	old, st, err := a.stream(ctx, topic)
	switch {
	case err != nil:
		return err
	case st != absent:
		return ErrExists
	case old != nil && !old.Tomb:
		return ErrExpired
	}
	now := a.t.now.UnixMilli()
	m := &meta{ContentType: "application/json", Access: now, Created: now, App: app}
	m.setExpires(expires)
	if old != nil {
		m.Reclaim = old.Reclaim
	}
	if m.Base, err = a.t.marker(ctx, topic, markerCreate, createMarker{ContentType: m.ContentType}); err != nil {
		return err
	}
	return a.put(ctx, topic, m)
}

// Append appends one data event per payload (each a JSON message) to the
// alive, open stream of topic and returns the last one's sequence.
func (a *AppTx) Append(ctx context.Context, topic string, payloads []json.RawMessage) (int64, error) {
	last, err := a.AppendAll(ctx, []Appends{{Topic: topic, Payloads: payloads}})
	if err != nil {
		return 0, err
	}
	return last[0], nil
}

// Appends are the payloads to append to one stream (AppendAll).
type Appends struct {
	Topic    string
	Payloads []json.RawMessage
}

// AppendAll appends, in one call of the store, each of batches as Append
// does, in their order, and returns the sequence of each one's last event
// (0 when it has none). ErrNoStream, appending nothing, when a stream is
// not alive and open.
func (a *AppTx) AppendAll(ctx context.Context, batches []Appends) ([]int64, error) {
	var evs []storage.Event
	for _, b := range batches {
		m, st, err := a.stream(ctx, b.Topic)
		if err != nil {
			return nil, err
		}
		if st != alive || m.Closed {
			return nil, ErrNoStream
		}
		for _, p := range b.Payloads {
			ev, err := newEvent(b.Topic, a.dataType, p)
			if err != nil {
				return nil, err
			}
			evs = append(evs, ev)
		}
	}
	stored, err := a.t.appendAll(ctx, evs)
	if err != nil {
		return nil, err
	}
	last := make([]int64, len(batches))
	n := 0
	for i, b := range batches {
		if n += len(b.Payloads); len(b.Payloads) > 0 {
			last[i] = stored[n-1].Sequence
		}
	}
	return last, nil
}

// Set stores app in the alive stream of topic, expiring at expires (Unix
// ms; 0: never), and closes it when closeIt.
func (a *AppTx) Set(ctx context.Context, topic string, app json.RawMessage, expires int64, closeIt bool) error {
	m, st, err := a.stream(ctx, topic)
	if err != nil {
		return err
	}
	if st != alive {
		return ErrNoStream
	}
	m.App = app
	m.setExpires(expires)
	if closeIt && !m.Closed {
		last, err := a.t.Last(ctx, topic)
		if err != nil {
			return err
		}
		if err := a.t.close(ctx, topic, m, m.tail(last), nil); err != nil {
			return err
		}
	}
	return a.put(ctx, topic, m)
}

// setExpires sets the stream's absolute expiry (Stream-Expires-At).
func (m *meta) setExpires(ms int64) {
	m.Expires, m.ExpiresAt = ms, ""
	if ms > 0 {
		m.ExpiresAt = time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
	}
}

// BuryExpired buries topic's stream if it expired with no fork reading
// it, so that a create can follow (ErrExpired).
func (s *Sweeper) BuryExpired(ctx context.Context, topic string) error {
	return s.buryExpired(ctx, topic)
}
