package durable

import (
	"strconv"
)

// An offset on the wire is a sequence of the log written as 19 decimal
// digits, zero-padded, so that byte-wise order is numeric order for every
// positive int64. "-1" (and the protocol's zero offset, which clients and
// the conformance suite use for "the start") means the stream's start;
// "now" its tail.
const (
	offsetDigits = 19
	offsetStart  = "-1"
	offsetNow    = "now"
	// zeroOffset is the reference server's first offset, which the
	// protocol's suite sends as "the start of the stream".
	zeroOffset = "0000000000000000_0000000000000000"
)

func formatOffset(seq int64) string {
	var b [offsetDigits]byte
	s := strconv.AppendInt(b[:0:0], seq, 10)
	out := make([]byte, offsetDigits)
	for i := range out {
		out[i] = '0'
	}
	copy(out[offsetDigits-len(s):], s)
	return string(out)
}

// offsetKind is what a parsed offset names.
type offsetKind int

const (
	atStart offsetKind = iota // -1: the stream's start
	atTail                    // now
	atSeq                     // a sequence
)

// parseOffset parses the offset query parameter. ok is false for anything
// that is not -1, now, the zero offset or exactly 19 digits.
func parseOffset(s string) (kind offsetKind, seq int64, ok bool) {
	switch s {
	case offsetStart, zeroOffset:
		return atStart, 0, true
	case offsetNow:
		return atTail, 0, true
	}
	if len(s) != offsetDigits {
		return 0, 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return atSeq, n, true
}
