package durable

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/replayd/replayd/internal/event"
	"github.com/replayd/replayd/storage"
)

// How a request body becomes data events (see encoding), and how events
// become a response body again.

const (
	// maxMessage is the largest JSON message (the log's payload limit).
	maxMessage = 1 << 20
	// textChunk and binaryChunk bound the bytes of one event of a text or
	// binary stream: escaped as a JSON string (at most 6 bytes per byte)
	// or as base64 (4 per 3), a chunk stays under maxMessage.
	textChunk   = 128 << 10
	binaryChunk = 256 << 10
)

var (
	errEmptyArray  = errors.New("empty JSON arrays are not allowed in an append")
	errInvalidJSON = errors.New("invalid JSON")
	errNotUTF8     = errors.New("a text stream's body must be UTF-8")
	errTooLarge    = errors.New("request body too large")
	errMessageSize = errors.New("a JSON message is over 1 MiB")
)

// statusOf is the status a body error is answered with.
func statusOf(err error) int {
	if errors.Is(err, errTooLarge) || errors.Is(err, errMessageSize) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// readBody reads r's body, at most max bytes.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, errTooLarge
	}
	return b, err
}

// payloads cuts body into the payloads of data events of a stream with
// encoding enc. In JSON mode an array is flattened one level; an empty
// array is refused unless create (a PUT's body may be []).
func payloads(enc encoding, body []byte, create bool) ([]json.RawMessage, error) {
	switch enc {
	case encJSON:
		return jsonMessages(body, create)
	case encText:
		if !utf8.Valid(body) {
			return nil, errNotUTF8
		}
		var out []json.RawMessage
		for len(body) > 0 {
			n := min(len(body), textChunk)
			for n < len(body) && !utf8.RuneStart(body[n]) {
				n--
			}
			p, err := json.Marshal(string(body[:n]))
			if err != nil {
				return nil, err
			}
			out = append(out, p)
			body = body[n:]
		}
		return out, nil
	default:
		var out []json.RawMessage
		for len(body) > 0 {
			n := min(len(body), binaryChunk)
			p := make([]byte, 0, base64.StdEncoding.EncodedLen(n)+2)
			p = append(p, '"')
			p = base64.StdEncoding.AppendEncode(p, body[:n])
			out = append(out, append(p, '"'))
			body = body[n:]
		}
		return out, nil
	}
}

func jsonMessages(body []byte, create bool) ([]json.RawMessage, error) {
	if !event.ValidJSON(body) {
		return nil, errInvalidJSON
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	var items []json.RawMessage
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(trimmed, &items); err != nil {
			return nil, errInvalidJSON
		}
		if len(items) == 0 && !create {
			return nil, errEmptyArray
		}
	} else {
		items = []json.RawMessage{trimmed}
	}
	out := make([]json.RawMessage, len(items))
	for i, it := range items {
		var buf bytes.Buffer
		if err := json.Compact(&buf, it); err != nil {
			return nil, errInvalidJSON
		}
		if buf.Len() > maxMessage {
			return nil, errMessageSize
		}
		out[i] = buf.Bytes()
	}
	return out, nil
}

// dataBytes is the bytes an event contributes to a byte stream: the text
// of a JSON string payload (text streams), the bytes a base64 string
// payload decodes to (binary streams), else the payload itself (an event
// published to the topic by other means).
func dataBytes(enc encoding, payload json.RawMessage) []byte {
	if len(payload) < 2 || payload[0] != '"' {
		return payload
	}
	var s string
	if err := json.Unmarshal(payload, &s); err != nil {
		return payload
	}
	if enc == encBase64 {
		if b, err := base64.StdEncoding.DecodeString(s); err == nil {
			return b
		}
		return payload
	}
	return []byte(s)
}

// appendBody appends the response body of evs for a stream with encoding
// enc: in JSON mode one array of the messages; else the bytes.
func appendBody(b []byte, enc encoding, evs []storage.Event) []byte {
	if enc == encJSON {
		b = append(b, '[')
		for i, ev := range evs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, ev.Payload...)
		}
		return append(b, ']')
	}
	for _, ev := range evs {
		b = append(b, dataBytes(enc, ev.Payload)...)
	}
	return b
}

// newEvent makes an event of topic with a fresh UUIDv7 event id.
func newEvent(topic, typ string, payload json.RawMessage) (storage.Event, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return storage.Event{}, err
	}
	return storage.Event{EventID: id.String(), Type: typ, Topic: topic, Payload: payload}, nil
}
