//go:build linux

package replayd

import (
	"sync"
	"syscall"
)

// Without net/http's background read nothing reads a detached connection,
// so nothing would see its client leave until a write failed. On Linux one
// epoll instance watches every detached connection of the process for the
// client's end (EPOLLRDHUP: its FIN; EPOLLHUP, EPOLLERR: a reset) and
// cancels that stream's context, as net/http does for a stream it serves.
// It costs one goroutine (blocked in epoll_wait) for the whole process,
// started with the first detached stream and stopped with the last, and a
// map entry per stream: no goroutine or buffer per connection.

// departureWatch can be turned off by tests, to exercise the check at
// write that other systems use.
var departureWatch = true

var departures struct {
	mu      sync.Mutex
	w       *epollWatcher // nil while nothing is watched
	next    int32         // the last token handed out
	cancels map[int32]func()
}

// epollWatcher is one epoll instance and the goroutine waiting on it.
type epollWatcher struct {
	epfd  int
	stopW int           // writing here stops the goroutine
	stopR int           // registered with token 0
	n     int           // connections watched
	done  chan struct{} // closed when the goroutine stops
}

// watchDeparture calls gone once the client of raw's connection closes or
// resets it, until the returned unwatch is called (before the connection
// is closed). false if it cannot watch.
func watchDeparture(raw syscall.RawConn, gone func()) (unwatch func(), ok bool) {
	if !departureWatch {
		return nil, false
	}
	d := &departures
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.w
	if w == nil {
		var err error
		if w, err = newEpollWatcher(); err != nil {
			return nil, false
		}
		d.w = w
		d.cancels = make(map[int32]func())
		go w.run()
	}
	token := d.next
	for { // 0 is the stop pipe's; skip tokens still in use after a wrap
		token++
		if _, used := d.cancels[token]; token != 0 && !used {
			break
		}
	}
	var ctlErr error
	err := raw.Control(func(fd uintptr) {
		ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: token}
		ctlErr = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
	})
	if err != nil || ctlErr != nil {
		if w.n == 0 {
			d.w = nil
			w.stop()
		}
		return nil, false
	}
	d.next = token
	d.cancels[token] = gone
	w.n++
	return func() {
		d.mu.Lock()
		delete(d.cancels, token)
		_ = raw.Control(func(fd uintptr) {
			_ = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
		})
		w.n--
		last := w.n == 0
		if last {
			d.w = nil
		}
		d.mu.Unlock()
		if last {
			w.stop()
		}
	}, true
}

func newEpollWatcher() (*epollWatcher, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		syscall.Close(epfd)
		return nil, err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: 0}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p[0], &ev); err != nil {
		syscall.Close(epfd)
		syscall.Close(p[0])
		syscall.Close(p[1])
		return nil, err
	}
	return &epollWatcher{epfd: epfd, stopR: p[0], stopW: p[1], done: make(chan struct{})}, nil
}

// stop ends the goroutine, waits for it and releases the descriptors.
func (w *epollWatcher) stop() {
	for {
		if _, err := syscall.Write(w.stopW, []byte{0}); err != syscall.EINTR {
			break
		}
	}
	<-w.done
	syscall.Close(w.epfd)
	syscall.Close(w.stopR)
	syscall.Close(w.stopW)
}

func (w *epollWatcher) run() {
	defer close(w.done)
	var evs [64]syscall.EpollEvent
	d := &departures
	for {
		n, err := syscall.EpollWait(w.epfd, evs[:], -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return // EBADF and the like: nothing more can be watched
		}
		for _, ev := range evs[:n] {
			if ev.Fd == 0 {
				return
			}
			d.mu.Lock()
			gone := d.cancels[ev.Fd]
			d.mu.Unlock()
			if gone != nil {
				gone()
			}
		}
	}
}
