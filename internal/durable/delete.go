package durable

import "net/http"

// DELETE removes a stream: a ds.delete marker tells the topic's Handler()
// readers, its producers' state goes, and its record becomes a tombstone
// (sweep.go) until the sweep has pruned its events, through the marker. A
// stream created again at the path starts above the marker, so an offset
// of the deleted one is gone (410), never read as the new one's. A stream
// that forks still read is soft-deleted instead (fork.go), and buried when
// the last of them goes.
func (h *Handler) delete(w http.ResponseWriter, r *http.Request, topic string) {
	ctx := r.Context()
	// The sources are named to the transaction, which may collect them.
	v, err := h.readAt(ctx, topic, atTail, 0)
	if err != nil {
		h.answerErr(w, r, topic, err)
		return
	}
	topics := append([]string{topic}, v.m.Parents...)
	err = h.update(ctx, topics, func(t *txn) error {
		m, err := t.aliveStream(ctx, topic)
		if err != nil {
			return err
		}
		if m.Base != v.m.Base {
			return refuse(http.StatusConflict, "the stream was replaced meanwhile: retry")
		}
		marker, err := t.marker(ctx, topic, markerDelete, struct{}{})
		if err != nil {
			return err
		}
		if m.Forks > 0 {
			m.Deleted = true
			return t.put(ctx, topic, m)
		}
		if err := t.bury(ctx, topic, m, marker); err != nil {
			return err
		}
		return t.unfork(ctx, m)
	})
	if err != nil {
		h.answerErr(w, r, topic, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
