package durable

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
)

// Idempotent producers: Producer-Id, Producer-Epoch and Producer-Seq name
// one append; its state (the epoch, the highest seq accepted) is read and
// written in the append's own transaction, so a retry after a crash at any
// point is stored exactly once: the state and the data commit together or
// not at all.

// producerState is a producer's stored state. Base names the stream
// incarnation it belongs to: a re-created stream starts without it.
type producerState struct {
	Epoch int64 `json:"epoch"`
	Seq   int64 `json:"seq"`
	Base  int64 `json:"base"`
}

// parseProducer reads the producer headers: nil when none is given.
func parseProducer(r *http.Request) (*producerKey, *refusal) {
	hasID := len(r.Header.Values(hProducerID)) > 0
	hasEpoch := len(r.Header.Values(hProducerEpoch)) > 0
	hasSeq := len(r.Header.Values(hProducerSeq)) > 0
	if !hasID && !hasEpoch && !hasSeq {
		return nil, nil
	}
	if !hasID || !hasEpoch || !hasSeq {
		return nil, refuse(http.StatusBadRequest, "Producer-Id, Producer-Epoch and Producer-Seq go together")
	}
	id := r.Header.Get(hProducerID)
	if id == "" || len(id) > 256 {
		return nil, refuse(http.StatusBadRequest, "invalid Producer-Id")
	}
	epoch, ok1 := parseCount(r.Header.Get(hProducerEpoch))
	seq, ok2 := parseCount(r.Header.Get(hProducerSeq))
	if !ok1 {
		return nil, refuse(http.StatusBadRequest, "invalid Producer-Epoch: a non-negative integer")
	}
	if !ok2 {
		return nil, refuse(http.StatusBadRequest, "invalid Producer-Seq: a non-negative integer")
	}
	return &producerKey{ID: id, Epoch: epoch, Seq: seq}, nil
}

// parseCount parses a non-negative integer of digits only, at most 2^53-1
// (what every client's numbers hold).
func parseCount(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n <= 1<<53-1
}

// checkProducer decides p's append against its stored state: nil to
// accept it (with the state to store), else the refusal: 204 for a
// duplicate, 403 for a stale epoch, 409 for a gap, 400 for a new epoch
// not starting at 0.
func (t *txn) checkProducer(ctx context.Context, topic string, m *meta, p *producerKey) (*producerState, *refusal, error) {
	raw, ok, err := t.Producer(ctx, topic, p.ID)
	if err != nil {
		return nil, nil, err
	}
	var st producerState
	if ok {
		if err := json.Unmarshal(raw, &st); err != nil || st.Base != m.Base {
			ok = false
		}
	}
	next := &producerState{Epoch: p.Epoch, Seq: p.Seq, Base: m.Base}
	epochHdr := func(e int64) [2]string { return [2]string{hProducerEpoch, strconv.FormatInt(e, 10)} }
	switch {
	case !ok:
		if p.Seq != 0 {
			return nil, gapRefusal(0, p.Seq), nil
		}
	case p.Epoch < st.Epoch:
		return nil, refuse(http.StatusForbidden, "stale producer epoch", epochHdr(st.Epoch)), nil
	case p.Epoch > st.Epoch:
		if p.Seq != 0 {
			return nil, refuse(http.StatusBadRequest, "a new producer epoch must start at sequence 0"), nil
		}
	case p.Seq <= st.Seq:
		return nil, &refusal{status: http.StatusNoContent, headers: [][2]string{epochHdr(p.Epoch),
			{hProducerSeq, strconv.FormatInt(st.Seq, 10)}}}, nil
	case p.Seq != st.Seq+1:
		return nil, gapRefusal(st.Seq+1, p.Seq), nil
	}
	return next, nil, nil
}

func gapRefusal(expected, received int64) *refusal {
	return refuse(http.StatusConflict, "producer sequence gap",
		[2]string{hExpectedSeq, strconv.FormatInt(expected, 10)},
		[2]string{hReceivedSeq, strconv.FormatInt(received, 10)})
}

func (t *txn) putProducer(ctx context.Context, topic, id string, st *producerState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return t.PutProducer(ctx, topic, id, b)
}
