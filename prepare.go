package replayd

import (
	"fmt"

	"github.com/google/uuid"
)

// PrepareEvent checks and completes an event exactly as Publish does,
// without storing it: for a store that takes events by another path than
// the hub's writer (replaydpg's publishing inside the application's own
// transaction). The returned event holds the topic, the type (WithType,
// else "message", the default of Options.DefaultType), the event id
// (WithEventID, else a fresh UUIDv7) and the payload encoded as Publish
// stores it; Sequence and CreatedAt are zero. An error wraps ErrInvalid
// when the input is at fault.
func PrepareEvent(topic string, payload any, opts ...PublishOption) (Event, error) {
	po := publishOptions{eventType: defaultType}
	for _, o := range opts {
		o(&po)
	}
	return prepareEvent(topic, payload, po)
}

// prepareEvent is Publish's validation of one event, with its options
// applied.
func prepareEvent(topic string, payload any, po publishOptions) (Event, error) {
	if err := validateTopic(topic); err != nil {
		return Event{}, err
	}
	if err := validateName("event type", po.eventType); err != nil {
		return Event{}, err
	}
	if po.eventIDSet {
		if err := validateName("event id", po.eventID); err != nil {
			return Event{}, err
		}
	} else {
		id, err := uuid.NewV7()
		if err != nil {
			return Event{}, fmt.Errorf("replayd: publish: %w", err)
		}
		po.eventID = id.String()
	}
	data, err := encodePayload(payload)
	if err != nil {
		return Event{}, err
	}
	return Event{EventID: po.eventID, Type: po.eventType, Topic: topic, Payload: data}, nil
}
