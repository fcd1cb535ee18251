package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/event"
)

// prepareAsTx prepares an event as replaydpg's PublishTx does: the
// options applied over event.DefaultType, then event.Prepare.
func prepareAsTx(topic string, payload any, opts ...PublishOption) (Event, error) {
	o := event.Options{Type: event.DefaultType}
	for _, opt := range opts {
		opt(&o)
	}
	return event.Prepare(topic, payload, o)
}

// event.Prepare, as a PublishTx outside the hub calls it, is Publish's
// validation: what one refuses the other refuses with the same error, and
// what one accepts comes out the same.
func TestPrepareIsPublishs(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	ctx := context.Background()
	cases := []struct {
		topic   string
		payload any
		opts    []PublishOption
	}{
		{" room", 1, nil},
		{strings.Repeat("t", 257), 1, nil},
		{"room", json.RawMessage(`{`), nil},
		{"room", make(chan int), nil},
		{"room", json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`), nil},
		{"room", 1, []PublishOption{WithType("")}},
		{"room", 1, []PublishOption{WithEventID("a\nb")}},
		{"room", 1, []PublishOption{WithType("chat"), WithEventID("ok-1")}},
		{"", map[string]int{"n": 1}, []PublishOption{WithEventID("ok-2")}},
	}
	for _, c := range cases {
		pe, perr := prepareAsTx(c.topic, c.payload, c.opts...)
		ev, err := h.Publish(ctx, c.topic, c.payload, c.opts...)
		switch {
		case (perr == nil) != (err == nil):
			t.Errorf("topic %.20q: Prepare %v, Publish %v", c.topic, perr, err)
		case err != nil && (perr.Error() != err.Error() || !errors.Is(perr, ErrInvalid)):
			t.Errorf("topic %.20q: Prepare %v, Publish %v", c.topic, perr, err)
		case err == nil && (pe.EventID != ev.EventID || pe.Type != ev.Type || pe.Topic != ev.Topic || string(pe.Payload) != string(ev.Payload) || pe.Sequence != 0):
			t.Errorf("Prepare %+v, Publish %+v", pe, ev)
		}
	}
	if ev, err := prepareAsTx("room", 1); err != nil || ev.Type != "message" || len(ev.EventID) != 36 {
		t.Errorf("defaults: %+v, %v", ev, err)
	}
}
