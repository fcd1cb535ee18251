package durable

import (
	"net/http"
	"strconv"
)

// HEAD answers a stream's metadata: its tail, content type, close, TTL and
// expiry. It does not slide the TTL, and is never cached.
func (h *Handler) head(w http.ResponseWriter, r *http.Request, topic string) {
	v, err := h.readAt(r.Context(), topic, atTail, 0)
	hd := w.Header()
	hd.Set("Cache-Control", "no-store")
	if err != nil {
		if ref, ok := err.(*refusal); ok {
			w.WriteHeader(ref.status)
			return
		}
		h.answerErr(w, r, topic, err)
		return
	}
	m := v.m
	hd.Set("Content-Type", m.ContentType)
	hd.Set(hNextOffset, formatOffset(v.tail))
	if m.Closed {
		hd.Set(hClosed, "true")
	}
	if m.TTL != nil {
		hd.Set(hTTL, strconv.FormatInt(*m.TTL, 10))
	}
	if m.ExpiresAt != "" {
		hd.Set(hExpiresAt, m.ExpiresAt)
	}
	tag := `"` + strconv.FormatInt(m.Base, 10) + ":-1:" + formatOffset(v.tail)
	if m.Closed {
		tag += ":c"
	}
	hd.Set("ETag", tag+`"`)
	w.WriteHeader(http.StatusOK)
}
