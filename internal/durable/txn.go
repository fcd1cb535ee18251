package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/replayd/replayd/storage"
)

// Marker events: a stream's creation, close and deletion, on its topic.
// They are positions (the base) or nothing on the Durable Streams side,
// which knows them by the sequences in the stream's metadata; Handler()
// readers of the topic get them as typed events, which is how they learn
// a stream was closed or deleted. A Go-API event that happens to use one of
// these types is data.
const (
	markerCreate = "ds.create"
	markerClose  = "ds.close"
	markerDelete = "ds.delete"
)

// A refusal is an answer decided inside a stream transaction: returned
// from its fn, it rolls the transaction back and is answered.
type refusal struct {
	status  int
	msg     string
	code    string // a 410's code
	headers [][2]string
}

func (r *refusal) Error() string { return r.msg }

func refuse(status int, msg string, headers ...[2]string) *refusal {
	return &refusal{status: status, msg: msg, headers: headers}
}

// answer writes r.
func (r *refusal) answer(w http.ResponseWriter) {
	for _, kv := range r.headers {
		w.Header().Set(kv[0], kv[1])
	}
	if r.status == http.StatusNoContent || r.status == http.StatusOK {
		w.WriteHeader(r.status)
		return
	}
	if r.status == http.StatusGone && r.code != "" {
		goneError(w, r.code, r.msg)
		return
	}
	httpError(w, r.status, r.msg)
}

// txn is one stream transaction: the store's, the time it runs at, and the
// events it appended, delivered once it commits.
type txn struct {
	storage.StreamTx
	h      *Handler
	now    time.Time
	events []storage.Event
}

// update runs fn in a stream transaction of topics and, once it commits,
// delivers the events it appended. fn's *refusal (or any error) rolls it
// back and is returned.
func (h *Handler) update(ctx context.Context, topics []string, fn func(t *txn) error) error {
	var t *txn
	err := h.Store.UpdateStreams(ctx, topics, func(tx storage.StreamTx) error {
		t = &txn{StreamTx: tx, h: h, now: h.Now()}
		return fn(t)
	})
	if err == nil && len(t.events) > 0 && h.Deliver != nil {
		h.Deliver(t.events)
	}
	return err
}

// answerErr answers the error of update: a refusal as itself, else 503.
func (h *Handler) answerErr(w http.ResponseWriter, r *http.Request, topic string, err error) {
	var ref *refusal
	if errors.As(err, &ref) {
		ref.answer(w)
		return
	}
	if r.Context().Err() != nil {
		return
	}
	h.serverError(w, r, topic, err)
}

// stream returns the record of topic, decoded, and its state.
func (t *txn) stream(ctx context.Context, topic string) (*meta, state, error) {
	rec, ok, err := t.Stream(ctx, topic)
	if err != nil || !ok {
		return nil, absent, err
	}
	m, err := decodeMeta(rec)
	if err != nil {
		return nil, absent, err
	}
	return m, m.state(t.now), nil
}

// aliveStream returns the stream of topic if it is alive, else the
// refusal a request to it gets: 404, or 410 for a deleted one.
func (t *txn) aliveStream(ctx context.Context, topic string) (*meta, error) {
	m, st, err := t.stream(ctx, topic)
	switch {
	case err != nil:
		return nil, err
	case st == absent:
		return nil, refuse(http.StatusNotFound, "stream not found")
	case st == gone:
		return nil, refuse(http.StatusGone, "the stream was deleted")
	}
	return m, nil
}

func (t *txn) put(ctx context.Context, topic string, m *meta) error {
	rec, err := m.record(topic, t.now)
	if err != nil {
		return err
	}
	return t.PutStream(ctx, rec)
}

// appendEvents appends events of topic, of type typ, one per payload, and
// returns the sequence of the last (0 for none).
func (t *txn) appendEvents(ctx context.Context, topic, typ string, payloads []json.RawMessage) (int64, error) {
	evs := make([]storage.Event, len(payloads))
	for i, p := range payloads {
		ev, err := newEvent(topic, typ, p)
		if err != nil {
			return 0, err
		}
		evs[i] = ev
	}
	stored, err := t.appendAll(ctx, evs)
	if err != nil || len(stored) == 0 {
		return 0, err
	}
	return stored[len(stored)-1].Sequence, nil
}

// appendAll appends evs (fresh event ids) in one call of the store and
// returns them as stored.
func (t *txn) appendAll(ctx context.Context, evs []storage.Event) ([]storage.Event, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	res, err := t.Append(ctx, evs)
	if err != nil {
		return nil, err
	}
	from := len(t.events)
	for _, r := range res {
		if r.Err != nil {
			if errors.Is(r.Err, storage.ErrInvalid) {
				return nil, refuse(http.StatusBadRequest, r.Err.Error())
			}
			return nil, r.Err
		}
		if r.Duplicate {
			return nil, fmt.Errorf("replayd: durable streams: a fresh event id was a duplicate")
		}
		t.events = append(t.events, r.Event)
	}
	return t.events[from:], nil
}

// marker appends a marker event of topic and returns its sequence.
func (t *txn) marker(ctx context.Context, topic, typ string, payload any) (int64, error) {
	p, err := json.Marshal(payload)
	if err != nil {
		return 0, err
	}
	return t.appendEvents(ctx, topic, typ, []json.RawMessage{p})
}
