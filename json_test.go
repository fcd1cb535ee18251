package replayd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/event"
)

var jsonSeeds = []string{
	``, ` `, `null`, `true`, `false`, `nul`, `truex`, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `1e`, `1e+`, `1E-7`,
	`-1.5e10`, `2.`, `.5`, `""`, `"a\"b"`, `"\u00e9"`, `"\u00g9"`, `"\x"`, "\"a\tb\"", "\"\xff\"", `"`,
	`[]`, `[1,]`, `[,1]`, `[1 2]`, ` [ 1 , [ ] , { } ] `, `{}`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{a:1}`,
	`{"a":{"b":[true,false,null]}}`, `{"a":1}x`, `1 2`, "\n{\r\n\t\"a\" : 1\n}\n", `{"a":1`, `[`, `]`,
	`"\/\b\f\n\r\t\\"`, `+1`, `Infinity`, `NaN`, "\x00", "1\x00",
	strings.Repeat("[", event.MaxJSONDepth) + strings.Repeat("]", event.MaxJSONDepth),
	strings.Repeat("[", event.MaxJSONDepth+1) + strings.Repeat("]", event.MaxJSONDepth+1),
	strings.Repeat(`{"a":`, event.MaxJSONDepth) + "1" + strings.Repeat("}", event.MaxJSONDepth),
	strings.Repeat(`{"a":`, event.MaxJSONDepth+1) + "1" + strings.Repeat("}", event.MaxJSONDepth+1),
}

// FuzzValidJSON holds validJSON to encoding/json.Valid's answers.
func FuzzValidJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Add(benchPayload)
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := validJSON(data), json.Valid(data); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid says %v", data, got, want)
		}
	})
}

// pollJSONSeeds are strings and payloads the poll answer's encoder must
// encode as encoding/json does: the copy-as-is cases and every kind of
// escape, compaction and error.
var pollJSONSeeds = append([]string{
	`order.updated`, `a b`, `a"b`, `a\b`, `<a&b>`, "a\u2028b", "a\u2029b", "\u00e9", "\x7f", "\x1f",
	"\xff", "\xe2\x80", `{"a":"<b>"}`, `{"a":"x y"}`, `{"a": 1}`, `{"a":"\u2028"}`, "{\"a\":\"\u2028\"}",
	`{"a":"\"<"}`, `{"a":"\\"}`, `{"a":"\\\""} `, `[1,2,{"b":[null,true]}]`,
}, jsonSeeds...)

// FuzzPollAnswerJSON holds the poll answer's encoder to encoding/json's
// bytes and errors: the answer is the same on the wire as before it had
// its own encoder.
func FuzzPollAnswerJSON(f *testing.F) {
	for _, s := range pollJSONSeeds {
		f.Add(s, []byte(s), false)
		f.Add(s, []byte(s), true)
	}
	f.Fuzz(func(t *testing.T, s string, data []byte, withGap bool) {
		topic := s
		ans := pollAnswer{
			Topics: []string{s, "b"},
			Cursor: 7,
			Head:   -9,
			More:   withGap,
			Events: []pollEvent{
				{ID: 8, Type: s, Data: json.RawMessage(`{"x":1}`)},
				{ID: 9, Type: "t", Topic: &topic, Data: json.RawMessage(data)},
			},
		}
		if withGap {
			ans.Gap = &wireGap{Reason: s, ResumedFrom: ptr(int64(3)), MissedThrough: ptr(int64(5)), ReplayLimit: 4}
		}
		checkPollAnswerJSON(t, ans)
	})
}

// TestPollAnswerJSON checks the encoder on the answers' shapes: empty,
// nil slices, a nil payload, a broadcast.
func TestPollAnswerJSON(t *testing.T) {
	topic := "a"
	for _, ans := range []pollAnswer{
		{},
		{Topics: []string{}, Events: []pollEvent{}},
		{Topics: []string{"a"}, Events: []pollEvent{{ID: 1, Type: "m", Data: nil}}},
		{Topics: []string{"a"}, Events: []pollEvent{{ID: 1, Type: "m", Data: json.RawMessage{}}}},
		{Topics: []string{"a"}, More: true, Gap: &wireGap{Reason: reasonPruned}, Events: []pollEvent{
			{ID: 1, Type: "m", Data: json.RawMessage(`"s"`)},
			{ID: 2, Type: "m", Topic: &topic, Data: json.RawMessage(`{"a":[1,2]}`)},
		}},
	} {
		checkPollAnswerJSON(t, ans)
	}
}

func checkPollAnswerJSON(t *testing.T, ans pollAnswer) {
	t.Helper()
	want, wantErr := json.Marshal(ans)
	got, err := ans.appendJSON([]byte("x"))
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%+v: err %v, encoding/json: %v", ans, err, wantErr)
	}
	if err == nil && string(got) != "x"+string(want) {
		t.Fatalf("%+v:\n got %s\nwant %s", ans, got[1:], want)
	}
	if err != nil {
		return
	}
	// Streamed through a small buffer, as writePollAnswer sends a large
	// answer: the same bytes.
	for _, flushAt := range []int{1, 2, 7, 64} {
		var out bytes.Buffer
		e := pollEncoder{out: &out, flushAt: flushAt}
		e.head(&ans)
		for i := range ans.Events {
			if err := e.event(&ans.Events[i]); err != nil {
				t.Fatalf("%+v: streamed: %v", ans, err)
			}
		}
		e.tail(&ans)
		e.flush()
		if out.String() != string(want) {
			t.Fatalf("%+v: streamed with flushAt %d:\n got %s\nwant %s", ans, flushAt, out.Bytes(), want)
		}
	}
}
