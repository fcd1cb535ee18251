package durable

import (
	"net/http"
	"time"

	"github.com/replayd/replayd/internal/live"
)

// live=long-poll: what follows the offset at once, or else a wait for it,
// woken by an append to the topic on any node (the hub's live delivery, as
// PollHandler's polls are), up to MaxWait; then 204. A closed stream at
// its tail answers 204 at once, saying so.
func (h *Handler) longPoll(w http.ResponseWriter, r *http.Request, topic string, v *view, waiter *live.Waiter) {
	ctx := r.Context()
	hd := w.Header()
	client := r.URL.Query().Get("cursor")
	var timeout <-chan time.Time
	for {
		if len(v.events) > 0 {
			hd.Set(hCursor, h.cursor(client))
			h.writePage(w, r, v, false, "")
			return
		}
		if v.m.Closed {
			hd.Set(hNextOffset, formatOffset(v.after))
			hd.Set(hUpToDate, "true")
			hd.Set(hClosed, "true")
			if timeout != nil {
				hd.Set(hCursor, h.cursor(client))
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if timeout == nil {
			release, ok := h.AcquireSlot()
			if !ok {
				hd.Set("Retry-After", "1")
				httpError(w, http.StatusServiceUnavailable, "server busy, retry later")
				return
			}
			defer release()
			t := time.NewTimer(h.MaxWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-waiter.Woken():
			h.Live.AddWaiter(waiter) // before the next read, as above
		case <-timeout:
			hd.Set(hNextOffset, formatOffset(v.after))
			hd.Set(hUpToDate, "true")
			hd.Set(hCursor, h.cursor(client))
			w.WriteHeader(http.StatusNoContent)
			return
		case <-h.Done:
			hd.Set(hNextOffset, formatOffset(v.after))
			w.WriteHeader(http.StatusNoContent)
			return
		case <-ctx.Done():
			return
		}
		next, err := h.readAfter(ctx, topic, v.m, v.after)
		if err != nil {
			h.answerErr(w, r, topic, err)
			return
		}
		v = next
	}
}
