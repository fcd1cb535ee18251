package replayd

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/replayd/replayd/internal/event"
)

// What Publish accepts is checked in internal/event, which replaydpg's
// PublishTx shares (see there); these are the root's names for its checks.

// validateTopic is event.ValidateTopic: "" or a topic Publish accepts.
func validateTopic(topic string) error { return event.ValidateTopic(topic) }

// validateName is event.ValidateName: an event type or event id.
func validateName(what, name string) error { return event.ValidateName(what, name) }

// validJSON is event.ValidJSON: encoding/json.Valid without allocating.
func validJSON(data []byte) bool { return event.ValidJSON(data) }

// encodePayload is event.EncodePayload: a Publish payload as stored.
func encodePayload(payload any) (json.RawMessage, error) { return event.EncodePayload(payload) }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("replayd: %w: "+format, append([]any{ErrInvalid}, args...)...)
}

// parseCursor parses a Last-Event-ID: a decimal integer 0 ≤ c ≤ 2^63-1,
// digits only.
func parseCursor(s string) (int64, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	c, err := strconv.ParseInt(s, 10, 64)
	return c, err == nil
}
