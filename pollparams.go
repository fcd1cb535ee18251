package replayd

import (
	"net/url"
	"slices"
	"strings"
	"time"
)

// pollParams are a poll request's query parameters, checked (PROTOCOL.md, the poll transport).
type pollParams struct {
	cursor int64 // valid when fresh is false
	fresh  bool  // no cursor given
	limit  int
	wait   time.Duration
}

// defaultPollLimit is a poll answer's size when the request names none.
const defaultPollLimit = 100

// parsePollParams reads cursor, limit and wait from query. A parameter given
// empty is treated as absent; a malformed one is an error naming it, and so
// is one given more than once with values that are not all the same (each
// is then checked as one value would be). limit is lowered to maxLimit and
// wait to maxWait.
func parsePollParams(query url.Values, maxLimit int, maxWait time.Duration) (pollParams, error) {
	p := pollParams{fresh: true, limit: min(defaultPollLimit, maxLimit)}
	for _, name := range []string{"cursor", "limit", "wait"} {
		if vs := query[name]; len(vs) > 1 && slices.ContainsFunc(vs[1:], func(v string) bool { return v != vs[0] }) {
			return p, invalidf("%s is given more than once, with different values", name)
		}
	}
	if s := query.Get("cursor"); s != "" {
		c, ok := parseCursor(s)
		if !ok {
			return p, invalidf("cursor %q is not a decimal integer in [0, 2^63-1]", s)
		}
		p.cursor, p.fresh = c, false
	}
	if s := query.Get("limit"); s != "" {
		n, ok := parseDigitsClamped(s, maxLimit)
		if !ok || n < 1 {
			return p, invalidf("limit %q is not an integer of at least 1", s)
		}
		p.limit = n
	}
	if s := query.Get("wait"); s != "" {
		d, ok := parseSecondsClamped(s, maxWait)
		if !ok {
			return p, invalidf("wait %q is not a number of seconds", s)
		}
		p.wait = d
	}
	return p, nil
}

// parseDigitsClamped parses a non-empty run of decimal digits of any length,
// returning min(value, ceiling).
func parseDigitsClamped(s string, ceiling int) (int, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		n = n*10 + int(c-'0')
		if n > ceiling {
			// Keep reading only to validate: every byte is a digit already.
			return ceiling, true
		}
	}
	return n, true
}

// parseSecondsClamped parses seconds written as digits with an optional
// fraction ("25", "0.5", ".5", "2."), returning min(value, ceiling). Signs,
// exponents and words such as Inf are refused.
func parseSecondsClamped(s string, ceiling time.Duration) (time.Duration, bool) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" ||
		strings.TrimLeft(whole, "0123456789") != "" || strings.TrimLeft(frac, "0123456789") != "" {
		return 0, false
	}
	secs := 0
	if whole != "" {
		secs, _ = parseDigitsClamped(whole, int(ceiling/time.Second)+1)
	}
	d := time.Duration(secs) * time.Second
	scale := time.Second / 10
	for i := 0; i < len(frac) && scale > 0; i++ {
		d += time.Duration(frac[i]-'0') * scale
		scale /= 10
	}
	return min(d, ceiling), true
}
