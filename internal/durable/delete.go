package durable

import "net/http"

// DELETE removes a stream: its record and its producers go, a ds.delete
// marker tells the topic's Handler() readers, and its events stay in the
// log until retention prunes them (the log deletes only what retention
// condemns). A stream created again at the path starts above the marker,
// so an offset of the deleted one is gone (410), never read as the new
// one's.
func (h *Handler) delete(w http.ResponseWriter, r *http.Request, topic string) {
	err := h.update(r.Context(), []string{topic}, func(t *txn) error {
		ctx := r.Context()
		_, ok, err := t.stream(ctx, topic)
		if err != nil {
			return err
		}
		if !ok {
			return refuse(http.StatusNotFound, "stream not found")
		}
		if _, err := t.marker(ctx, topic, markerDelete, struct{}{}); err != nil {
			return err
		}
		return t.DeleteStream(ctx, topic)
	})
	if err != nil {
		h.answerErr(w, r, topic, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
