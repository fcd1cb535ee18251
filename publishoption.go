package replayd

import "github.com/replayd/replayd/internal/event"

// A PublishOption changes one Publish call (and one PublishTx, here or in
// replaydpg: its Options are internal/event's, which such a path applies
// before event.Prepare).
type PublishOption func(*event.Options)

// WithType sets the event's SSE type instead of Options.DefaultType.
func WithType(eventType string) PublishOption {
	return func(o *event.Options) { o.Type = eventType }
}

// WithEventID sets the event's idempotency key. Publishing again with an id
// that is already stored stores and delivers nothing and returns the
// original event, so a publisher can retry safely.
func WithEventID(id string) PublishOption {
	return func(o *event.Options) { o.EventID, o.EventIDSet = id, true }
}
