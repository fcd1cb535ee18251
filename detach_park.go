package replayd

import (
	"sync/atomic"
	"time"
)

// A detached stream, once its hello and replay are written, parks: it has
// no goroutine of its own while it is idle. What it is then is its socket,
// its queue, its floor, a heartbeat timer and three ways to be woken: a
// publisher queuing a frame or a kill (stream.notify), its heartbeat timer,
// and its context's end (the client left, or a revocation). A wake-up
// starts a run on a goroutine that lives only while the stream has
// something to do: it writes what is queued and the heartbeat due, then
// the stream parks again. A goroutine's stack is at least 2 KiB, and an
// idle stream's, sized by the deepest write it made, 4 to 8 KiB: without
// one an idle stream holds only its heap.
//
// Runs go to runners: goroutines kept a while once idle (at most
// maxIdleRunners of them, for runnerLinger, or until the hub of the stream
// they ran last closes), so that a broadcast to many streams reuses
// goroutines rather than starting one a stream (which the race detector,
// for one, makes slow). A run is never queued behind another: with no
// runner idle, a new one starts, so a stream whose write waits on a slow
// client holds up no other.

// Runners.
const (
	maxIdleRunners = 256
	runnerLinger   = time.Second
)

var (
	runnerHandoff = make(chan *liveStream) // to an idle runner
	idleRunners   atomic.Int32
)

// schedule runs l on an idle runner, or on a new one.
func schedule(l *liveStream) {
	select {
	case runnerHandoff <- l:
	default:
		go runner(l)
	}
}

// runner runs l, then the streams handed to it while it is kept.
func runner(l *liveStream) {
	var t *time.Timer
	for {
		done := l.h.done
		l.run()
		if idleRunners.Add(1) > maxIdleRunners {
			idleRunners.Add(-1)
			return
		}
		if t == nil {
			t = time.NewTimer(runnerLinger)
		} else {
			t.Reset(runnerLinger)
		}
		select {
		case l = <-runnerHandoff:
			idleRunners.Add(-1)
		case <-t.C:
			idleRunners.Add(-1)
			return
		case <-done:
			idleRunners.Add(-1)
			t.Stop()
			return
		}
	}
}

// parked is a detached stream's live state.
type parked struct {
	cw    *connWriter
	end   func()       // ends the stream's context and its revocation watch
	state atomic.Int32 // parkIdle, …
}

// A parked stream's states. Only the goroutine that moved it from parkIdle
// to parkRunning runs it; a wake-up during a run asks it to look again
// before it parks.
const (
	parkIdle    int32 = iota // nothing to do, no goroutine
	parkRunning              // a goroutine runs it
	parkAgain                // a goroutine runs it, and must look again
	parkEnded                // ended: wake-ups do nothing
)

// parkDetached parks l, a detached stream past its replay, after a first
// run on this goroutine (which then ends).
func (l *liveStream) parkDetached(cw *connWriter, end func()) {
	p := &l.parked
	p.cw, p.end = cw, end
	p.state.Store(parkRunning) // before any wake-up can come: this goroutine runs it first
	wake := l.wakeup
	l.arm(wake, l.heartbeatDue)
	l.s.mu.Lock()
	l.s.notify = wake
	l.s.mu.Unlock()
	l.run()
}

// wakeup makes the stream look at its queue, its heartbeat and its end: on
// a new goroutine if it is parked, after the run in progress otherwise.
func (l *liveStream) wakeup() {
	p := &l.parked
	for {
		switch p.state.Load() {
		case parkIdle:
			if p.state.CompareAndSwap(parkIdle, parkRunning) {
				schedule(l)
				return
			}
		case parkRunning:
			if p.state.CompareAndSwap(parkRunning, parkAgain) {
				return
			}
		default: // parkAgain: it looks again anyway; parkEnded
			return
		}
	}
}

// heartbeatDue is the heartbeat timer's function, on a goroutine of the
// timer's own, which runs the stream if it is parked.
func (l *liveStream) heartbeatDue() {
	l.beatDue.Store(true)
	if l.parked.state.CompareAndSwap(parkIdle, parkRunning) {
		l.run()
		return
	}
	l.wakeup()
}

// run runs the stream until it has nothing left to do, and parks it, or
// ends it. The caller moved it to parkRunning.
func (l *liveStream) run() {
	p := &l.parked
	defer func() {
		if v := recover(); v != nil {
			l.stop(v)
		}
	}()
	for {
		if !l.step() {
			l.stop(nil)
			return
		}
		if p.state.CompareAndSwap(parkRunning, parkIdle) {
			return
		}
		p.state.Store(parkRunning) // it was parkAgain
	}
}

// stop ends a parked stream: no wake-up runs it again, its subscription
// and counts go (finish), its connection is closed and its admission freed
// (endDetached). p is a panic recovered from its run, or nil.
func (l *liveStream) stop(p any) {
	pk := &l.parked
	pk.state.Store(parkEnded)
	l.disarm()
	l.finish()
	l.h.endDetached(pk.cw, l.remote, pk.end, p)
}
