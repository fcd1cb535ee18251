package live

import (
	"errors"
	"net/http"
	"sync"
	"time"
)

// writeTimeout bounds each write to a client (a write gets between half of
// it and all of it, see write). A client that cannot take a write that long
// is disconnected; it resumes from the log.
const writeTimeout = 15 * time.Second

// bufPool holds write buffers, so an idle connection keeps none.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// Send builds frames with build into a pooled buffer, writes and flushes
// them to w, the stream's ResponseWriter; false if the stream must end.
func (s *Stream) Send(w http.ResponseWriter, build func([]byte) []byte) bool {
	bp := bufPool.Get().(*[]byte)
	b := build((*bp)[:0])
	ok := s.write(w, b)
	if cap(b) <= 64<<10 { // a burst's big buffer is left to the GC
		*bp = b[:0]
		bufPool.Put(bp)
	}
	return ok
}

// write writes b and flushes, within writeTimeout; false if the stream
// must end.
func (s *Stream) write(w http.ResponseWriter, b []byte) bool {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return false
	}
	// Moving the deadline costs a runtime timer update, so it is moved only
	// once half of it is used up: every write gets 7.5 to 15s. It is set
	// under mu, so a concurrent kill's deadline is never overwritten.
	if now := time.Now(); now.After(s.deadline.Add(-writeTimeout / 2)) {
		s.deadline = now.Add(writeTimeout)
		if err := s.rc.SetWriteDeadline(s.deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
			s.mu.Unlock()
			return false
		}
	}
	s.mu.Unlock()
	if len(b) > 0 {
		if _, err := w.Write(b); err != nil {
			return false
		}
	}
	return s.rc.Flush() == nil
}
