// Package event checks and completes an event before it is stored: the
// rules Publish applies (topic, event type and event id, the payload's
// encoding and limits) and the defaults it fills in (the type, a fresh
// UUIDv7 as event id).
//
// It lives below the root so that a store with a publishing path of its
// own, outside the hub's writer (replaydpg's PublishTx, inside the
// application's transaction), stores exactly what Publish would: the root's
// PublishOption is a func(*Options), so such a store takes the root's
// options (replayd.WithType, replayd.WithEventID), applies them to an
// Options and calls Prepare. Every importer outside the root module couples
// its version to the root's: keep Options and Prepare as they are, or
// change them with every importer in one step.
package event

import (
	"fmt"

	"github.com/google/uuid"
	"github.com/replayd/replayd/storage"
)

// DefaultType is the event type of an event given none (Options.Type's
// value before any option; a hub's Options.DefaultType replaces it there).
const DefaultType = "message"

// Options are one publish's options, set by the root's PublishOptions.
type Options struct {
	Type    string // the event type
	EventID string // the event id, when EventIDSet
	// EventIDSet: EventID was given (WithEventID), and is checked rather
	// than generated.
	EventIDSet bool
}

// Prepare is Publish's validation of one event, with its options applied:
// the returned event holds the topic, o.Type, the event id (o.EventID, or a
// fresh UUIDv7 unless o.EventIDSet) and the payload encoded as Publish
// stores it; Sequence and CreatedAt are zero. An error wraps
// storage.ErrInvalid when the input is at fault.
func Prepare(topic string, payload any, o Options) (storage.Event, error) {
	if err := ValidateTopic(topic); err != nil {
		return storage.Event{}, err
	}
	if err := ValidateName("event type", o.Type); err != nil {
		return storage.Event{}, err
	}
	if o.EventIDSet {
		if err := ValidateName("event id", o.EventID); err != nil {
			return storage.Event{}, err
		}
	} else {
		id, err := uuid.NewV7()
		if err != nil {
			return storage.Event{}, fmt.Errorf("replayd: publish: %w", err)
		}
		o.EventID = id.String()
	}
	data, err := EncodePayload(payload)
	if err != nil {
		return storage.Event{}, err
	}
	return storage.Event{EventID: o.EventID, Type: o.Type, Topic: topic, Payload: data}, nil
}
