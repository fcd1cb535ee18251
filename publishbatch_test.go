package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
)

// PublishBatch stores each event or refuses it on its own, reports a
// duplicate as such, and commits the valid ones in sequence order.
func TestPublishBatchEachOnItsOwn(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{})
	ctx := context.Background()
	if _, err := h.Publish(ctx, "a", 1, WithEventID("seen")); err != nil {
		t.Fatal(err)
	}
	res := h.PublishBatch(ctx, []Event{
		{Topic: "a", Payload: json.RawMessage(`{"n":1}`)},
		{Topic: "a", EventID: "seen", Payload: json.RawMessage(`2`)},
		{Topic: "a", Payload: json.RawMessage(`not json`)},
		{Topic: "b", Type: "custom", EventID: "new", Payload: json.RawMessage(`3`)},
		{Topic: "a", EventID: "new", Payload: json.RawMessage(`4`)},
	})
	if len(res) != 5 {
		t.Fatalf("%d results", len(res))
	}
	if res[0].Err != nil || res[0].Duplicate || res[0].Event.Sequence == 0 || res[0].Event.Type != "message" {
		t.Errorf("item 0: %+v", res[0])
	}
	if res[1].Err != nil || !res[1].Duplicate || string(res[1].Event.Payload) != "1" {
		t.Errorf("item 1 (a stored id): %+v", res[1])
	}
	if !errors.Is(res[2].Err, ErrInvalid) {
		t.Errorf("item 2 (invalid JSON): %+v", res[2])
	}
	if res[3].Err != nil || res[3].Duplicate || res[3].Event.Type != "custom" || res[3].Event.Sequence <= res[0].Event.Sequence {
		t.Errorf("item 3: %+v", res[3])
	}
	if res[4].Err != nil || !res[4].Duplicate || res[4].Event.Sequence != res[3].Event.Sequence {
		t.Errorf("item 4 (an id earlier in the batch): %+v", res[4])
	}
	evs, err := h.Replay(ctx, "", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("stored %d events, want 3: %+v", len(evs), evs)
	}
}
