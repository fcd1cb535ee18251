package durable_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// AppendAll appends each batch to its stream and returns, for each, the
// sequence of its own last event (0 for an empty batch); a batch for a
// stream that is not alive appends nothing at all.
func TestAppendAllReturnsEachBatchsLast(t *testing.T) {
	db, err := sqlitestore.OpenDB(filepath.Join(t.TempDir(), "log.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := sqlitestore.Open(db, sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topics := []string{"a", "b", "c"}
	update := func(fn func(a *durable.AppTx) error) {
		t.Helper()
		if err := s.UpdateStreams(ctx, topics, func(tx storage.StreamTx) error {
			return fn(durable.NewAppTx(tx, time.Now(), "message"))
		}); err != nil {
			t.Fatal(err)
		}
	}
	update(func(a *durable.AppTx) error {
		for _, topic := range topics {
			if err := a.Create(ctx, topic, json.RawMessage(`{}`), 0); err != nil {
				return err
			}
		}
		return nil
	})
	msg := func(n int) []json.RawMessage {
		ps := make([]json.RawMessage, n)
		for i := range ps {
			ps[i] = json.RawMessage(`{"i":1}`)
		}
		return ps
	}
	update(func(a *durable.AppTx) error {
		last, err := a.AppendAll(ctx, []durable.Appends{{Topic: "a", Payloads: msg(2)}, {Topic: "b"}, {Topic: "c", Payloads: msg(3)}})
		if err != nil {
			return err
		}
		want := map[string]int64{}
		for _, ev := range a.Events() {
			want[ev.Topic] = max(want[ev.Topic], ev.Sequence)
		}
		if len(a.Events()) != 5 || last[0] != want["a"] || last[1] != 0 || last[2] != want["c"] || last[0] == last[2] {
			t.Errorf("AppendAll = %v; the events appended %v", last, a.Events())
		}
		n := len(a.Events())
		if _, err := a.AppendAll(ctx, []durable.Appends{{Topic: "a", Payloads: msg(1)}, {Topic: "none", Payloads: msg(1)}}); !errors.Is(err, durable.ErrNoStream) {
			t.Errorf("AppendAll to a stream that does not exist: %v", err)
		}
		if len(a.Events()) != n {
			t.Errorf("AppendAll that failed appended %d events", len(a.Events())-n)
		}
		return nil
	})
}
