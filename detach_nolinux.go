//go:build !linux

package replayd

import "syscall"

// watchDeparture: only Linux has a watcher (detach_linux.go); elsewhere a
// client that left is seen by the check before a write.
func watchDeparture(raw syscall.RawConn, gone func()) (unwatch func(), ok bool) { return nil, false }

// departureWatch is Linux's switch for tests (detach_linux.go); there is
// no watcher to switch here.
var departureWatch = false
