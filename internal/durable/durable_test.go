package durable

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/replayd/replayd/storage"
)

func TestOffsets(t *testing.T) {
	for _, seq := range []int64{1, 42, 1764712345678901, 1<<63 - 1} {
		s := formatOffset(seq)
		if len(s) != offsetDigits {
			t.Fatalf("formatOffset(%d) = %q: not %d digits", seq, s, offsetDigits)
		}
		kind, got, ok := parseOffset(s)
		if !ok || kind != atSeq || got != seq {
			t.Fatalf("parseOffset(%q) = %v, %d, %v; want atSeq, %d", s, kind, got, ok, seq)
		}
	}
	if formatOffset(9) >= formatOffset(10) || formatOffset(99999) >= formatOffset(1764712345678901) {
		t.Fatal("offsets do not sort byte-wise as their sequences")
	}
	for _, s := range []string{"-1", zeroOffset} {
		if kind, _, ok := parseOffset(s); !ok || kind != atStart {
			t.Fatalf("parseOffset(%q): not the start", s)
		}
	}
	if kind, _, ok := parseOffset("now"); !ok || kind != atTail {
		t.Fatal("now is not the tail")
	}
	for _, bad := range []string{"", "0", "123", "00000000000000000001 ", " 0000000000000000001", "000000000000000000a",
		"00000000000000000000", "9999999999999999999", "-000000000000000001", "0000000000000000_0000000000000001", "..", "NOW", "1e5"} {
		if _, _, ok := parseOffset(bad); ok {
			t.Errorf("parseOffset(%q) accepted", bad)
		}
	}
}

func TestPayloadsJSON(t *testing.T) {
	ps, err := payloads(encJSON, []byte(` [ {"a": 1}, [1, 2], "x" ] `), false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`{"a":1}`, `[1,2]`, `"x"`}
	if len(ps) != len(want) {
		t.Fatalf("%d messages, want %d", len(ps), len(want))
	}
	for i := range want {
		if string(ps[i]) != want[i] {
			t.Errorf("message %d = %s, want %s (one level flattened, compacted)", i, ps[i], want[i])
		}
	}
	if _, err := payloads(encJSON, []byte(`[]`), false); err != errEmptyArray {
		t.Errorf("POST []: %v, want errEmptyArray", err)
	}
	if ps, err := payloads(encJSON, []byte(`[]`), true); err != nil || len(ps) != 0 {
		t.Errorf("PUT []: %v, %d messages; want none", err, len(ps))
	}
	for _, bad := range []string{`{`, `[1,]`, `nul`, `{"a":1}{}`} {
		if _, err := payloads(encJSON, []byte(bad), false); err != errInvalidJSON {
			t.Errorf("%s: %v, want errInvalidJSON", bad, err)
		}
	}
	big := `"` + strings.Repeat("x", maxMessage) + `"`
	if _, err := payloads(encJSON, []byte(big), false); err != errMessageSize {
		t.Errorf("a message over 1 MiB: %v, want errMessageSize", err)
	}
}

func TestPayloadsBytesRoundTrip(t *testing.T) {
	text := strings.Repeat("héllo wörld ✓ ", textChunk/8) // multi-byte runes across chunk edges
	ps, err := payloads(encText, []byte(text), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) < 2 {
		t.Fatalf("%d chunks: want the text cut", len(ps))
	}
	var got []byte
	for _, p := range ps {
		if len(p) > maxMessage {
			t.Fatalf("a chunk of %d bytes is over the payload limit", len(p))
		}
		b := dataBytes(encText, p)
		if !utf8.Valid(b) {
			t.Fatal("a chunk was cut inside a rune")
		}
		got = append(got, b...)
	}
	if string(got) != text {
		t.Fatal("text chunks do not join back to the text")
	}
	if _, err := payloads(encText, []byte{0xff, 'a'}, false); err != errNotUTF8 {
		t.Errorf("bytes that are not UTF-8 on a text stream: %v", err)
	}
	bin := make([]byte, binaryChunk*2+7)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	ps, err = payloads(encBase64, bin, false)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]storage.Event, len(ps))
	for i, p := range ps {
		if !json.Valid(p) {
			t.Fatalf("chunk %d is not JSON", i)
		}
		evs[i].Payload = p
	}
	if !bytes.Equal(appendBody(nil, encBase64, evs), bin) {
		t.Fatal("binary chunks do not join back to the bytes")
	}
}

func TestDataBytesOfOtherEvents(t *testing.T) {
	// Events published to the topic by the Go API.
	if got := string(dataBytes(encText, json.RawMessage(`{"a":1}`))); got != `{"a":1}` {
		t.Errorf("an object on a text stream contributes %q", got)
	}
	if got := string(dataBytes(encBase64, json.RawMessage(`"not base64!"`))); got != `"not base64!"` {
		t.Errorf("a string that is not base64 on a binary stream contributes %q", got)
	}
}

func TestAppendLinesCannotForgeAnEvent(t *testing.T) {
	for _, payload := range []string{"a\n\nevent: control\ndata: x", "a\r\rb", "a\r\n\r\nb", "\n", "a\r"} {
		frame := string(appendLines(nil, []byte(payload)))
		body := strings.TrimSuffix(frame, "\n\n")
		for _, line := range strings.Split(body, "\n") {
			if !strings.HasPrefix(line, "data:") {
				t.Errorf("payload %q: line %q is not a data field", payload, line)
			}
		}
		if strings.Contains(body, "\r") {
			t.Errorf("payload %q: a CR is left in the frame", payload)
		}
	}
}

func TestCursorJitter(t *testing.T) {
	now := cursorEpoch.Add(1000*cursorInterval + time.Second)
	h := New(Config{Now: func() time.Time { return now }})
	if got := h.cursor(""); got != "1000" {
		t.Fatalf("cursor = %s, want the interval number 1000", got)
	}
	if got := h.cursor("999"); got != "1000" {
		t.Fatalf("an older cursor echoed: %s, want 1000", got)
	}
	for range 50 {
		got, err := strconv.ParseInt(h.cursor("1000"), 10, 64)
		if err != nil || got <= 1000 || got > 1000+3600/20 {
			t.Fatalf("a cursor at the current interval echoed got %d (%v): want one larger, by at most an hour", got, err)
		}
	}
}
