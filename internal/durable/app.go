package durable

import (
	"context"
	"encoding/json"
	"errors"
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
type AppTx struct {
	t        *txn
	dataType string
}

// NewAppTx wraps tx, running at now; data events get the type dataType
// (the hub's default event type, as the protocol's data events).
func NewAppTx(tx storage.StreamTx, now time.Time, dataType string) *AppTx {
	return &AppTx{t: &txn{StreamTx: tx, now: now}, dataType: dataType}
}

// Now is the transaction's time, in Unix ms.
func (a *AppTx) Now() int64 { return a.t.now.UnixMilli() }

// Events are the events appended so far, to deliver after the commit.
func (a *AppTx) Events() []storage.Event { return a.t.events }

// Get returns the stream of topic if it is alive, else nil.
func (a *AppTx) Get(ctx context.Context, topic string) (*AppStream, error) {
	m, st, err := a.t.stream(ctx, topic)
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
	old, st, err := a.t.stream(ctx, topic)
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
	return a.t.put(ctx, topic, m)
}

// Append appends one data event per payload (each a JSON message) to the
// alive, open stream of topic and returns the last one's sequence.
func (a *AppTx) Append(ctx context.Context, topic string, payloads []json.RawMessage) (int64, error) {
	m, st, err := a.t.stream(ctx, topic)
	if err != nil {
		return 0, err
	}
	if st != alive || m.Closed {
		return 0, ErrNoStream
	}
	return a.t.appendEvents(ctx, topic, a.dataType, payloads)
}

// Set stores app in the alive stream of topic, expiring at expires (Unix
// ms; 0: never), and closes it when closeIt.
func (a *AppTx) Set(ctx context.Context, topic string, app json.RawMessage, expires int64, closeIt bool) error {
	m, st, err := a.t.stream(ctx, topic)
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
	return a.t.put(ctx, topic, m)
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
