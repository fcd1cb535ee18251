package replayd

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/replayd/replayd/storage"
)

// Ready reports whether the hub can read and write its log, for a load
// balancer's readiness probe: nil when it can. It reads the head, then, if
// the store is a [storage.WriteProber], checks that it could write. The SQLite store
// takes and releases the log's write lock (BEGIN IMMEDIATE, ROLLBACK)
// without writing anything; the probe queues behind the store's own commits
// instead of racing them for SQLite's lock, so it never stalls a publish; a
// database that another connection keeps locked, or that is read-only,
// makes it fail. The PostgreSQL store (replaydpg) likewise queues for the
// lock every append takes first, and fails when it cannot have it within
// ctx. It does not prove there is disk space left. ctx bounds the whole
// check: give it a deadline. After Close it returns ErrClosed.
func (h *EventHub) Ready(ctx context.Context) error {
	if h.isClosed() {
		return ErrClosed
	}
	if _, err := h.store.Head(ctx); err != nil {
		return fmt.Errorf("replayd: ready: read: %w", err)
	}
	p, ok := h.store.(storage.WriteProber)
	if !ok {
		return nil
	}
	if err := p.ProbeWrite(ctx); err != nil {
		if h.isClosed() { // Close released the log meanwhile
			return ErrClosed
		}
		return fmt.Errorf("replayd: ready: %w", err)
	}
	return nil
}

func (h *EventHub) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// readyTimeout bounds the check ReadyHandler runs for one request.
const readyTimeout = 2 * time.Second

// ReadyHandler serves Ready for a load balancer: 200 "ok" when the hub can
// read and write its log, else 503 "not ready" (the error is logged at
// warn level, never sent). Each check is bounded by 2s and by the request.
//
//	mux.Handle("/readyz", hub.ReadyHandler())
func (h *EventHub) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := h.Ready(ctx); err != nil {
			if r.Context().Err() == nil {
				h.logger.Warn("replayd: not ready", "remote", r.RemoteAddr, "err", err)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready\n"))
			return
		}
		w.Write([]byte("ok\n"))
	})
}
