// Package jobtest holds what the job-stream tests of several packages
// share (the root's, hubtest's, the client's): an LLM-like answer to
// write, and the UTF-16 length the jobs count text in.
package jobtest

import (
	"fmt"
	"unicode/utf16"
)

// Tokens is an LLM-like answer of n tokens, one write each, except that
// some characters are split across two writes: ASCII, accents,
// characters of two UTF-16 units (a surrogate pair in JavaScript), one of
// them split mid-character (its UTF-8 bytes over two writes), and a
// three-byte character split the same way. len(Tokens(n)) > n.
func Tokens(n int) []string {
	out := make([]string, 0, n+n/3)
	for i := range n {
		switch i % 6 {
		case 1:
			out = append(out, " café")
		case 3:
			out = append(out, " 😀🎉")
		case 4:
			out = append(out, " \xf0\x9f", "\x98\x82") // 😂 split mid-character
		case 5:
			out = append(out, "\xe2\x82", "\xac") // € split mid-character
		default:
			out = append(out, fmt.Sprintf(" tok%d", i))
		}
	}
	return out
}

// Len16 is s's length in UTF-16 code units, as a job's text offsets
// count (and a JavaScript string's length).
func Len16(s string) int64 { return int64(len(utf16.Encode([]rune(s)))) }

// From16 is s from UTF-16 offset k on; an offset inside a surrogate pair
// starts at the pair, as the server's reads do.
func From16(s string, k int64) string {
	var n int64
	for i, r := range s {
		w := int64(utf16.RuneLen(r))
		if n+w > k {
			return s[i:]
		}
		n += w
	}
	return ""
}
