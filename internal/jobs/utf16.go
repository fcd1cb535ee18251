package jobs

import (
	"strings"
	"unicode/utf8"
)

// Text offsets are in UTF-16 code units, as a JavaScript string's (the
// stream-relay wire protocol's since and nextOffset).

// len16 is s's length in UTF-16 code units (s is valid UTF-8).
func len16(s string) int64 {
	var n int64
	for _, r := range s {
		if r >= 0x10000 {
			n += 2
		} else {
			n++
		}
	}
	return n
}

// from16 is s from UTF-16 offset k on (0 <= k); an offset inside a
// surrogate pair starts at the pair (never half a character).
func from16(s string, k int64) string {
	var n int64
	for i, r := range s {
		w := int64(1)
		if r >= 0x10000 {
			w = 2
		}
		if n+w > k {
			return s[i:]
		}
		n += w
	}
	return ""
}

// splitComplete splits b into its longest prefix that does not end in an
// incomplete UTF-8 sequence, and the rest (at most 3 bytes, held back
// until more text comes: a token may end mid-character).
func splitComplete(b []byte) (done, rest []byte) {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i], b[i:]
			}
			break
		}
	}
	return b, nil
}

// validText is b as stored: invalid UTF-8 replaced by U+FFFD, so that its
// UTF-16 length is the one readers count.
func validText(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }
