package replayd

import (
	"net/url"
	"testing"
	"time"
)

func TestParsePollParams(t *testing.T) {
	const maxLimit, maxWait = 1000, 30 * time.Second
	for _, tc := range []struct {
		query string
		want  pollParams
		bad   bool
	}{
		{query: "", want: pollParams{fresh: true, limit: 100}},
		{query: "cursor=&limit=&wait=", want: pollParams{fresh: true, limit: 100}},
		{query: "cursor=0", want: pollParams{cursor: 0, limit: 100}},
		{query: "cursor=9223372036854775807", want: pollParams{cursor: 1<<63 - 1, limit: 100}},
		{query: "cursor=9223372036854775808", bad: true},
		{query: "cursor=-1", bad: true},
		{query: "cursor=+1", bad: true},
		{query: "cursor=1.0", bad: true},
		{query: "cursor=%201", bad: true},
		{query: "cursor=x", bad: true},
		{query: "limit=1", want: pollParams{fresh: true, limit: 1}},
		{query: "limit=1000", want: pollParams{fresh: true, limit: 1000}},
		{query: "limit=1001", want: pollParams{fresh: true, limit: 1000}},
		{query: "limit=99999999999999999999999999", want: pollParams{fresh: true, limit: 1000}},
		{query: "limit=0", bad: true},
		{query: "limit=000", bad: true},
		{query: "limit=-5", bad: true},
		{query: "limit=1e3", bad: true},
		{query: "limit=2.0", bad: true},
		{query: "wait=25", want: pollParams{fresh: true, limit: 100, wait: 25 * time.Second}},
		{query: "wait=0.5", want: pollParams{fresh: true, limit: 100, wait: 500 * time.Millisecond}},
		{query: "wait=.5", want: pollParams{fresh: true, limit: 100, wait: 500 * time.Millisecond}},
		{query: "wait=2.", want: pollParams{fresh: true, limit: 100, wait: 2 * time.Second}},
		{query: "wait=0", want: pollParams{fresh: true, limit: 100}},
		{query: "wait=0.000000001", want: pollParams{fresh: true, limit: 100, wait: time.Nanosecond}},
		{query: "wait=31", want: pollParams{fresh: true, limit: 100, wait: maxWait}},
		{query: "wait=99999999999999999999999", want: pollParams{fresh: true, limit: 100, wait: maxWait}},
		{query: "wait=29.9999", want: pollParams{fresh: true, limit: 100, wait: 29*time.Second + 999900*time.Microsecond}},
		{query: "wait=.", bad: true},
		{query: "wait=-1", bad: true},
		{query: "wait=%2B1", bad: true},
		{query: "wait=1e1", bad: true},
		{query: "wait=Inf", bad: true},
		{query: "wait=NaN", bad: true},
		{query: "wait=1.2.3", bad: true},
		{query: "wait=0x10", bad: true},
		// Given more than once: every value well-formed and the same
		// (issue 17, row 5).
		{query: "cursor=5&cursor=5", want: pollParams{cursor: 5, limit: 100}},
		{query: "limit=7&limit=7&limit=7", want: pollParams{fresh: true, limit: 7}},
		{query: "wait=.5&wait=.5", want: pollParams{fresh: true, limit: 100, wait: 500 * time.Millisecond}},
		{query: "cursor=&cursor=", want: pollParams{fresh: true, limit: 100}},
		{query: "cursor=5&cursor=abc", bad: true},
		{query: "cursor=abc&cursor=5", bad: true},
		{query: "cursor=5&cursor=6", bad: true},
		{query: "cursor=5&cursor=05", bad: true},
		{query: "cursor=5&cursor=", bad: true},
		{query: "cursor=&cursor=5", bad: true},
		{query: "cursor=x&cursor=x", bad: true},
		{query: "limit=1&limit=abc", bad: true},
		{query: "limit=1&limit=2", bad: true},
		{query: "limit=2000&limit=3000", bad: true},
		{query: "wait=1&wait=x", bad: true},
		{query: "wait=1&wait=1.0", bad: true},
	} {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parsePollParams(q, maxLimit, maxWait)
		switch {
		case tc.bad && err == nil:
			t.Errorf("%q: accepted as %+v", tc.query, got)
		case !tc.bad && err != nil:
			t.Errorf("%q: %v", tc.query, err)
		case !tc.bad && got != tc.want:
			t.Errorf("%q: %+v, want %+v", tc.query, got, tc.want)
		}
	}
}
