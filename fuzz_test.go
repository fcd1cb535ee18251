package replayd

import (
	"bytes"
	"errors"
	"io"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/internal/sseparse"
	"github.com/replayd/replayd/internal/wiretest"
)

// Fuzz targets for the three parsers and encoders that face untrusted or
// arbitrary input: the Last-Event-ID cursor, the topic, and the SSE frame
// encoding of an event. Their seed corpora run as ordinary tests; run one
// for real with, for example:
//
//	go test -run '^$' -fuzz '^FuzzFrameEncoding$' -fuzztime 1m .

// FuzzParseCursor checks that parseCursor accepts exactly the decimal
// integers 0..2^63-1 written with ASCII digits only (leading zeros allowed),
// and returns their value.
func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{
		"", "0", "1", "42", "007", "9223372036854775807", "9223372036854775808",
		"09223372036854775807", "18446744073709551616", "99999999999999999999999",
		"-0", "-1", "+1", " 1", "1 ", "1\n", "1.0", "1e3", "0x10", "1_000",
		"١٢", "１", "NaN", "∞", "\x00", "12\x003",
	} {
		f.Add(s)
	}
	maxCursor := new(big.Int).SetInt64(1<<63 - 1)
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseCursor(s)

		// The oracle: arbitrary-precision arithmetic on an ASCII digit string.
		want, wantOK := new(big.Int), s != ""
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				wantOK = false
				break
			}
		}
		if wantOK {
			want.SetString(s, 10)
			wantOK = want.Cmp(maxCursor) <= 0
		}
		if ok != wantOK {
			t.Fatalf("parseCursor(%q) ok = %v, want %v", s, ok, wantOK)
		}
		if !ok {
			return
		}
		if got < 0 || big.NewInt(got).Cmp(want) != 0 {
			t.Fatalf("parseCursor(%q) = %d, want %s", s, got, want)
		}
		// Accepted cursors survive the round trip through an SSE id line.
		if trimmed := strings.TrimLeft(s, "0"); strconv.FormatInt(got, 10) != trimmed && !(got == 0 && trimmed == "") {
			t.Fatalf("parseCursor(%q) = %d does not round-trip", s, got)
		}
	})
}

// FuzzValidateTopic checks that validateTopic accepts exactly the strings of
// at most 256 bytes that are valid UTF-8, hold no control character (C0,
// DEL or C1) and neither start nor end with white space (the handler trims
// the topic parameter, so such a topic could never be subscribed to), and
// that whatever it accepts is safe on an SSE line.
func FuzzValidateTopic(f *testing.F) {
	for _, s := range []string{
		"", "room-42", "a b", " lead", "trail ", "\u3000ideographic", "nbsp-inside\u00a0x", "ünïcödé", "日本語", "emoji-😀", "tab\there", "nl\n",
		"cr\r", "nul\x00", "del\x7f", "c1\u0085", "c1\u009f", "nbsp\u00a0", "ls\u2028",
		"bom\ufeff", "bad\xff", "half\xe6\x97", "surrogate\xed\xa0\x80",
		strings.Repeat("a", 256), strings.Repeat("a", 257), strings.Repeat("é", 128),
		strings.Repeat("é", 128) + "a", strings.Repeat("a", 255) + "é",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		err := validateTopic(topic)

		want := len(topic) <= 256 && utf8.ValidString(topic)
		for _, r := range topic {
			if r < 0x20 || (r >= 0x7f && r < 0xa0) {
				want = false
			}
		}
		if first, _ := utf8.DecodeRuneInString(topic); topic != "" && unicode.IsSpace(first) {
			want = false
		}
		if last, _ := utf8.DecodeLastRuneInString(topic); topic != "" && unicode.IsSpace(last) {
			want = false
		}
		if (err == nil) != want {
			t.Fatalf("validateTopic(%q) = %v, want ok = %v", topic, err, want)
		}
		if err == nil && strings.ContainsAny(topic, "\r\n\x00") {
			t.Fatalf("validateTopic accepted %q, which would break an SSE line", topic)
		}
	})
}

// FuzzFrameEncoding checks that an event frame, read back by an SSE parser
// that follows the WHATWG rules (CR, LF and CRLF all end a line), is exactly
// one frame with the event's id and type and its payload, line breaks turned
// into LF: a payload can never end the frame early, start another one, or
// inject a field. Types that Publish would reject are skipped.
func FuzzFrameEncoding(f *testing.F) {
	f.Add("message", []byte(`{"a":1}`), uint64(1))
	f.Add("hello", []byte(`{"topic":null,"cursor":0,"head":0}`), uint64(0))
	f.Add("t", []byte("{\n  \"a\": 1\n}"), uint64(42))
	f.Add("t", []byte("{\r\n\"a\":\r1}\r"), uint64(7))
	f.Add("t", []byte("x\n\nid: 99\nevent: evil\ndata: injected\n\n"), uint64(3))
	f.Add("t", []byte("x\r\rretry: 1\r\r"), uint64(3))
	f.Add("t", []byte("\n"), uint64(5))
	f.Add("t", []byte(""), uint64(5))
	f.Add("t", []byte(" leading space"), uint64(5))
	f.Add(" spaced:type", []byte("data: nested"), uint64(1<<63-1))
	f.Add("t", []byte(":comment\n:more"), uint64(9))
	f.Add("ünï", []byte("\x00\xff\xfe"), uint64(10))
	f.Fuzz(func(t *testing.T, typ string, payload []byte, seq uint64) {
		if validateName("event type", typ) != nil {
			return
		}
		ev := Event{Sequence: int64(seq >> 1), Type: typ, Payload: payload}
		prefix := []byte("retry: 10\n\n")
		b := live.AppendEventFrame(append([]byte(nil), prefix...), ev)
		if !bytes.HasPrefix(b, prefix) {
			t.Fatalf("live.AppendEventFrame changed the bytes before it")
		}
		if bytes.IndexByte(b, '\r') >= 0 {
			t.Fatalf("frame holds a CR: %q", b)
		}
		if !bytes.HasSuffix(b, []byte("\n\n")) {
			t.Fatalf("frame does not end with a blank line: %q", b)
		}
		// A second frame after it must come through untouched.
		b = live.AppendEventFrame(b, Event{Sequence: 1, Type: "next", Payload: []byte(`"after"`)})

		wantData := strings.ReplaceAll(string(payload), "\r\n", "\n")
		wantData = strings.ReplaceAll(wantData, "\r", "\n")

		got, fields := fuzzParseSSE(b)
		if len(got) != 3 || got[0] != (fuzzEvent{}) {
			t.Fatalf("parsed %d frames, want the retry frame and 2 events: %q", len(got), b)
		}
		got = got[1:]
		if got[0].id != strconv.FormatInt(ev.Sequence, 10) || got[0].typ != typ || got[0].data != wantData {
			t.Fatalf("frame round trip: got id %q type %q data %q, want %d %q %q",
				got[0].id, got[0].typ, got[0].data, ev.Sequence, typ, wantData)
		}
		if got[1].id != "1" || got[1].typ != "next" || got[1].data != `"after"` {
			t.Fatalf("the following frame was disturbed: %+v", got[1])
		}
		want := map[string]int{"retry": 1, "id": 2, "event": 2, "data": fields["data"]}
		for k, n := range fields {
			if want[k] != n {
				t.Fatalf("field %q appears %d times, want %d: %q", k, n, want[k], b)
			}
		}
		if lines := strings.Count(wantData, "\n") + 2; fields["data"] != lines {
			t.Fatalf("%d data lines, want %d", fields["data"], lines)
		}

		// The tests' frame reader (internal/wiretest), strict about field names,
		// agrees.
		out := make(chan frame, 4)
		if err := wiretest.ReadFrames(bytes.NewReader(b), out); !errors.Is(err, io.EOF) {
			t.Fatalf("wiretest.ReadFrames: %v", err)
		}
		close(out)
		var fs []frame
		for f := range out {
			fs = append(fs, f)
		}
		if len(fs) != 3 || fs[1].ID != got[0].id || fs[1].Event != typ || fs[1].Data != wantData {
			t.Fatalf("wiretest.ReadFrames disagrees: %+v", fs)
		}
	})
}

// fuzzEvent is one dispatched event of fuzzParseSSE.
type fuzzEvent struct{ id, typ, data string }

// fuzzParseSSE parses an event stream with the shared parser
// (internal/sseparse), which follows the WHATWG HTML standard's
// EventSource rules (§9.2.6) byte for byte: CRLF, LF and CR each end a
// line, a blank line dispatches, one space after the colon is dropped.
// Unlike a browser it dispatches retry-only frames too (with empty data),
// so that nothing is hidden from the test, and it counts every field name
// it sees.
func fuzzParseSSE(b []byte) (evs []fuzzEvent, fields map[string]int) {
	fields = map[string]int{}
	r := sseparse.NewReader(bytes.NewReader(b))
	r.Field = func(name, _ []byte) error {
		fields[string(name)]++
		return nil
	}
	for {
		f, err := r.Next()
		if err != nil {
			return evs, fields
		}
		evs = append(evs, fuzzEvent{id: string(f.ID), typ: string(f.Event), data: string(f.Data)})
	}
}
