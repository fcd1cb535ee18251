//go:build !unix

package replayd

// departureCheck: no portable non-blocking read here; a client that left
// is seen by a failing write.
const departureCheck = false

func (cw *connWriter) clientGone() bool { return false }
