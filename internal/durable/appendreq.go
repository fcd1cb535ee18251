package durable

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// POST appends: the body's data events, the Stream-Seq check, the
// producer's state and a close, all in one transaction.
func (h *Handler) append(w http.ResponseWriter, r *http.Request, topic string) {
	prod, ref := parseProducer(r)
	if ref != nil {
		ref.answer(w)
		return
	}
	closing := r.Header.Get(hClosed) == "true"
	seq := r.Header.Get(hSeq)
	ct := r.Header.Get("Content-Type")
	body, err := readBody(w, r, h.MaxBody)
	if err != nil {
		httpError(w, statusOf(err), err.Error())
		return
	}
	if len(body) == 0 && !closing {
		httpError(w, http.StatusBadRequest, "an append needs a body (or Stream-Closed: true)")
		return
	}
	if len(body) > 0 && ct == "" {
		httpError(w, http.StatusBadRequest, "an append needs a Content-Type")
		return
	}
	var next int64
	err = h.update(r.Context(), []string{topic}, func(t *txn) error {
		ctx := r.Context()
		m, err := t.aliveStream(ctx, topic)
		if err != nil {
			return err
		}
		last, err := t.Last(ctx, topic)
		if err != nil {
			return err
		}
		tail := m.tail(last)
		if m.Closed {
			if prod != nil && m.ClosedBy != nil && *m.ClosedBy == *prod {
				return &refusal{status: http.StatusNoContent, headers: [][2]string{
					{hNextOffset, formatOffset(tail)}, {hClosed, "true"},
					{hProducerEpoch, strconv.FormatInt(prod.Epoch, 10)},
					{hProducerSeq, strconv.FormatInt(prod.Seq, 10)}}}
			}
			if prod == nil && len(body) == 0 {
				// Closing a closed stream again.
				return &refusal{status: http.StatusNoContent, headers: [][2]string{
					{hNextOffset, formatOffset(tail)}, {hClosed, "true"}}}
			}
			return refuse(http.StatusConflict, "the stream is closed",
				[2]string{hClosed, "true"}, [2]string{hNextOffset, formatOffset(tail)})
		}
		if len(body) > 0 && !sameType(ct, m.ContentType) {
			return refuse(http.StatusConflict, "content type mismatch: the stream's is "+m.ContentType)
		}
		var st *producerState
		if prod != nil {
			var ref *refusal
			if st, ref, err = t.checkProducer(ctx, topic, m, prod); err != nil {
				return err
			} else if ref != nil {
				return ref
			}
		}
		if seq != "" {
			if m.StreamSeq != "" && seq <= m.StreamSeq {
				return refuse(http.StatusConflict, "Stream-Seq is not above the last one")
			}
			m.StreamSeq = seq
		}
		var ps []json.RawMessage
		if len(body) > 0 {
			if ps, err = payloads(encodingOf(m.ContentType), body, false); err != nil {
				return refuse(statusOf(err), err.Error())
			}
		}
		if last, err = t.appendEvents(ctx, topic, h.DataType, ps); err != nil {
			return err
		}
		if last > 0 {
			tail = last
		}
		if st != nil {
			if err := t.putProducer(ctx, topic, prod.ID, st); err != nil {
				return err
			}
		}
		if closing {
			if err := t.close(ctx, topic, m, tail, prod); err != nil {
				return err
			}
		}
		m.Access = t.now.UnixMilli()
		next = tail
		return t.put(ctx, topic, m)
	})
	if err != nil {
		h.answerErr(w, r, topic, err)
		return
	}
	hd := w.Header()
	hd.Set(hNextOffset, formatOffset(next))
	if closing {
		hd.Set(hClosed, "true")
	}
	if prod != nil {
		hd.Set(hProducerEpoch, strconv.FormatInt(prod.Epoch, 10))
		hd.Set(hProducerSeq, strconv.FormatInt(prod.Seq, 10))
		if len(body) > 0 {
			w.WriteHeader(http.StatusOK) // a producer's append; a close alone is 204
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}
