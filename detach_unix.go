//go:build unix

package replayd

import "syscall"

// departureCheck: clientGone can look at the socket.
const departureCheck = true

// clientGone reports whether the client closed or reset its end of the
// connection, with non-blocking reads on the socket. Nothing the client
// sends after its request is meant for the stream (the response ends with
// the connection), so bytes read here, a TLS alert included, are dropped.
func (cw *connWriter) clientGone() bool {
	gone := false
	err := cw.raw.Read(func(fd uintptr) bool {
		var buf [128]byte
		for range 64 { // at most 8 KiB a check; more waits for the next
			n, err := syscall.Read(int(fd), buf[:])
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return true
			case err != nil || n == 0:
				gone = true
				return true
			}
		}
		return true
	})
	return gone || err != nil
}
