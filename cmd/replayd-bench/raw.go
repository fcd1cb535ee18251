package main

import (
	"net/http"
	"strconv"
	"sync"
	"time"
)

// rawHub is the raw ceiling: the least a Go SSE fan-out can do over
// net/http. No log, no replay, no validation: a publish encodes the frame
// once and appends it to every client's queue; each client's handler
// goroutine drains everything queued into one write and one flush (the same
// coalescing replayd's streams do). Queues are unbounded.
type rawHub struct {
	mu      sync.Mutex // guards seq and clients, and orders publishes
	seq     int64
	clients map[*rawClient]struct{}
	done    chan struct{} // closed by close
	once    sync.Once
}

type rawClient struct {
	wake chan struct{}

	mu    sync.Mutex // guards queue
	queue [][]byte
}

func newRawHub() *rawHub {
	return &rawHub{clients: make(map[*rawClient]struct{}), done: make(chan struct{})}
}

func (h *rawHub) close() { h.once.Do(func() { close(h.done) }) }

// publish sends payload to every client as one SSE event frame.
func (h *rawHub) publish(payload []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	frame := make([]byte, 0, len(payload)+40)
	frame = append(frame, "id: "...)
	frame = strconv.AppendInt(frame, h.seq, 10)
	frame = append(frame, "\nevent: message\ndata: "...)
	frame = append(frame, payload...)
	frame = append(frame, "\n\n"...)
	for c := range h.clients {
		c.mu.Lock()
		c.queue = append(c.queue, frame)
		c.mu.Unlock()
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (h *rawHub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.clients)
}

func (h *rawHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream; charset=utf-8")
	hdr.Set("Cache-Control", "no-cache, no-transform")
	c := &rawClient{wake: make(chan struct{}, 1)}
	h.mu.Lock()
	h.clients[c] = struct{}{}
	seq := h.seq
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.clients, c)
		h.mu.Unlock()
	}()
	b := strconv.AppendInt([]byte("id: "), seq, 10)
	b = append(b, "\nevent: hello\ndata: {}\n\n"...)
	if _, err := w.Write(b); err != nil || rc.Flush() != nil {
		return
	}
	var spare [][]byte
	for {
		select {
		case <-c.wake:
		case <-r.Context().Done():
			return
		case <-h.done:
			return
		}
		c.mu.Lock()
		q := c.queue
		c.queue = spare
		c.mu.Unlock()
		b = b[:0]
		for _, f := range q {
			b = append(b, f...)
		}
		clear(q)
		spare = q[:0]
		_ = rc.SetWriteDeadline(time.Now().Add(15 * time.Second))
		if _, err := w.Write(b); err != nil || rc.Flush() != nil {
			return
		}
		if cap(b) > 64<<10 {
			b = nil
		}
	}
}
