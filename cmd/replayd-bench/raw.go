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
//
// Topics are as cheap as they can be: a client names one with ?topic= (or
// none: it gets everything), and a publish on a topic reaches that topic's
// clients and those with none; a publish on "" reaches every client.
type rawHub struct {
	mu      sync.Mutex // guards seq and clients, and orders publishes
	seq     int64
	clients map[string]map[*rawClient]struct{} // by the client's topic
	done    chan struct{}                      // closed by close
	once    sync.Once
}

type rawClient struct {
	topic string
	wake  chan struct{}

	mu    sync.Mutex // guards queue
	queue [][]byte
}

func newRawHub() *rawHub {
	return &rawHub{clients: make(map[string]map[*rawClient]struct{}), done: make(chan struct{})}
}

func (h *rawHub) close() { h.once.Do(func() { close(h.done) }) }

// publish sends payload as one SSE event frame to every client of topic
// ("": to every client).
func (h *rawHub) publish(topic string, payload []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	frame := make([]byte, 0, len(payload)+40)
	frame = append(frame, "id: "...)
	frame = strconv.AppendInt(frame, h.seq, 10)
	frame = append(frame, "\nevent: message\ndata: "...)
	frame = append(frame, payload...)
	frame = append(frame, "\n\n"...)
	for t, set := range h.clients {
		if topic != "" && t != "" && t != topic {
			continue
		}
		for c := range set {
			c.mu.Lock()
			c.queue = append(c.queue, frame)
			c.mu.Unlock()
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
}

func (h *rawHub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, set := range h.clients {
		n += len(set)
	}
	return n
}

func (h *rawHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream; charset=utf-8")
	hdr.Set("Cache-Control", "no-cache, no-transform")
	c := &rawClient{topic: r.URL.Query().Get("topic"), wake: make(chan struct{}, 1)}
	h.mu.Lock()
	set := h.clients[c.topic]
	if set == nil {
		set = make(map[*rawClient]struct{})
		h.clients[c.topic] = set
	}
	set[c] = struct{}{}
	seq := h.seq
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(set, c)
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
