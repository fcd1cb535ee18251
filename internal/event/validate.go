package event

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/replayd/replayd/storage"
)

// Limits on what Publish accepts (see replayd's Publish).
const (
	maxNameLen    = 256     // bytes, for topics, event types and event ids
	maxPayloadLen = 1 << 20 // bytes, encoded
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("replayd: %w: "+format, append([]any{storage.ErrInvalid}, args...)...)
}

// ValidateTopic accepts "" (broadcast, or the global scope) and any valid
// UTF-8 string of at most 256 bytes without control characters. Leading or
// trailing white space is refused too: the SSE handler trims the topic
// parameter, so such a topic could never be subscribed to.
func ValidateTopic(topic string) error {
	switch {
	case strings.TrimSpace(topic) != topic:
		return invalidf("topic %q has leading or trailing white space", topic)
	case len(topic) > maxNameLen:
		return invalidf("topic longer than %d bytes", maxNameLen)
	case !utf8.ValidString(topic):
		return invalidf("topic is not valid UTF-8")
	case strings.ContainsFunc(topic, unicode.IsControl):
		return invalidf("topic %q holds a control character", topic)
	}
	return nil
}

// ValidateName checks an event type or event id (what names it in the
// error): non-empty, at most 256 bytes, and free of CR, LF and NUL, which
// would break an SSE frame.
func ValidateName(what, name string) error {
	switch {
	case name == "":
		return invalidf("empty %s", what)
	case len(name) > maxNameLen:
		return invalidf("%s longer than %d bytes", what, maxNameLen)
	case strings.ContainsAny(name, "\r\n\x00"):
		return invalidf("%s %q holds CR, LF or NUL", what, name)
	}
	return nil
}

// EncodePayload turns a Publish payload into the JSON that is stored.
// json.RawMessage and []byte are taken as given if they hold valid JSON.
func EncodePayload(payload any) (json.RawMessage, error) {
	var raw []byte
	switch p := payload.(type) {
	case json.RawMessage:
		// Copied, so a caller reusing its buffer cannot change the event.
		raw = append([]byte(nil), p...)
	case []byte:
		raw = append([]byte(nil), p...)
	default:
		b, err := json.Marshal(payload)
		if err != nil {
			return nil, invalidf("payload: %v", err)
		}
		raw = b
	}
	if len(raw) > maxPayloadLen {
		return nil, invalidf("payload of %d bytes is over the %d-byte limit", len(raw), maxPayloadLen)
	}
	if !ValidJSON(raw) {
		return nil, invalidf("payload is not valid JSON")
	}
	return raw, nil
}
