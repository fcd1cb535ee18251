package replayd

import (
	"slices"
	"sync"
)

// pubQueue hands publishes to the writer goroutine. A publisher appends
// under mu and wakes the writer only when the writer asked to be woken: by
// the first publish when it is idle, or by the one that completes the batch
// it is gathering. The unbuffered channel before switched to the writer
// goroutine and back for every publish, and 64 publishers coming back at
// once spent a fifth of each batch's time on it.
//
// A unit in the queue is a request, or a PublishBatch group (its first
// request, carrying the group). Until the writer takes a unit, its
// publisher may withdraw it: nothing of it is then stored.
type pubQueue struct {
	mu     sync.Mutex
	units  []*publishReq
	events int  // events in units
	want   int  // wake the writer once events reaches want; 0: it waits for nothing
	closed bool // the writer has stopped: push refuses
	wake   chan struct{}
}

func newPubQueue() pubQueue { return pubQueue{wake: make(chan struct{}, 1)} }

// size is how many events r's unit holds.
func (r *publishReq) size() int { return max(len(r.group), 1) }

// push adds unit, reporting false if the writer has stopped.
func (q *pubQueue) push(unit *publishReq) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.units = append(q.units, unit)
	q.events += unit.size()
	if q.want > 0 && q.events >= q.want {
		q.want = 0
		select {
		case q.wake <- struct{}{}:
		default: // a wake is pending already
		}
	}
	return true
}

// ask reports whether the queue holds n events, and if not has the next
// push that brings it there send on wake. A wake may be stale, left by an
// earlier ask: the writer asks again after each.
func (q *pubQueue) ask(n int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.events >= n {
		q.want = 0
		return true
	}
	q.want = n
	return false
}

// len returns how many events the queue holds.
func (q *pubQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.events
}

// take moves units into batch, at least one if there is any, until batch
// holds max events (a group may take it past max).
func (q *pubQueue) take(batch []*publishReq, max int) []*publishReq {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.want = 0
	n := 0
	for n < len(q.units) && len(batch) < max {
		batch = q.units[n].addTo(batch)
		q.events -= q.units[n].size()
		n++
	}
	rest := copy(q.units, q.units[n:])
	clear(q.units[rest:])
	q.units = q.units[:rest]
	return batch
}

// withdraw takes unit back unless the writer has taken it, and reports
// whether it is withdrawn (now or before): then nothing of it is stored,
// and the writer never answers it.
func (q *pubQueue) withdraw(unit *publishReq) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if unit.withdrawn {
		return true
	}
	i := slices.Index(q.units, unit)
	if i < 0 {
		return false
	}
	q.units = slices.Delete(q.units, i, i+1)
	q.events -= unit.size()
	unit.withdrawn = true
	return true
}

// close refuses further pushes and returns the units never taken.
func (q *pubQueue) close() []*publishReq {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	units := q.units
	q.units, q.events = nil, 0
	return units
}
