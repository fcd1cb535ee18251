package live

import (
	"net/http"
	"sync"
	"time"
)

// A Frame is an event's SSE frame, encoded once for every stream that
// queues it.
type Frame struct {
	Sequence int64
	Bytes    []byte
}

// Stream is one SSE connection's queue of live frames. Dispatch pushes
// onto it without ever waiting; the handler goroutine drains it (Take,
// Release) into one write and one flush (Send, write.go).
type Stream struct {
	topics []string // the scope; none: global
	rc     *http.ResponseController

	// lastPushed is the sequence pushed last, so that an event matching
	// several of the stream's subscriptions is queued once. Guarded by
	// Hub.subsMu.
	lastPushed int64

	max  int           // cap on queued bytes; negative: none
	wake chan struct{} // signalled when the queue gains frames or s dies

	mu       sync.Mutex // guards the fields below
	queue    []*Frame
	spare    []*Frame  // the drained queue, reused
	queued   int       // bytes pushed and not yet written
	dead     bool      // over the cap or killed: the stream must end
	cut      bool      // killed for passing the cap
	deadline time.Time // the write deadline set last
}

// NewStream returns the queue of a stream of topics (none: global) written
// through rc, whose unsent frames may hold max bytes (negative: no cap).
// rc may be nil for a stream that is never written to.
func NewStream(topics []string, rc *http.ResponseController, max int) *Stream {
	return &Stream{topics: topics, rc: rc, max: max, wake: make(chan struct{}, 1)}
}

// Wake receives when the queue gains frames or the stream dies, and when
// Signal is called.
func (s *Stream) Wake() <-chan struct{} { return s.wake }

// Signal wakes the stream's reader of Wake, if it is not woken already.
func (s *Stream) Signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// What push did with a frame.
const (
	pushQueued  = iota
	pushDropped // the stream is dead already
	pushCut     // the frame would pass the cap: the stream is killed
)

// push queues f, or kills the stream if that would pass its cap.
func (s *Stream) push(f *Frame) int {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return pushDropped
	}
	// The cap applies only once something is unsent, so a frame of any
	// size Publish accepts always fits an empty queue. Frames are shared by
	// every connection, so the one frame costs a connection no memory.
	if s.max >= 0 && s.queued > 0 && s.queued+len(f.Bytes) > s.max {
		s.cut = true
		s.killLocked()
		s.mu.Unlock()
		return pushCut
	}
	if s.queue == nil {
		s.queue, s.spare = s.spare, nil
	}
	s.queue = append(s.queue, f)
	s.queued += len(f.Bytes)
	s.mu.Unlock()
	s.Signal()
	return pushQueued
}

// WasCut reports whether the stream was ended for passing its cap.
func (s *Stream) WasCut() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cut
}

// Take returns the queued frames; false if the stream must end. Hand them
// back with Release once they are written.
func (s *Stream) Take() ([]*Frame, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q, !s.dead
}

// Release returns a drained queue once its frames are written.
func (s *Stream) Release(q []*Frame) {
	n := 0
	for _, f := range q {
		n += len(f.Bytes)
	}
	clear(q)
	s.mu.Lock()
	s.queued -= n
	if s.spare == nil && cap(q) <= 1024 { // at most 8 KiB kept after a burst
		s.spare = q[:0]
	}
	s.mu.Unlock()
}

// Kill ends the stream: its handler returns at its next step, and a write
// in progress fails at once.
func (s *Stream) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Stream) killLocked() {
	if s.dead {
		return
	}
	s.dead = true
	clear(s.queue)
	s.queue = nil
	if s.rc != nil {
		_ = s.rc.SetWriteDeadline(time.Now())
	}
	s.Signal()
}
