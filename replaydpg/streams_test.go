package replaydpg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/replayd/replayd/storage"
)

// An event appended through UpdateStreams on one node wakes the other
// node as any append does: its WaitForAppend returns and its tailing hub
// (an hour's fallback poll: only NOTIFY wakes it) delivers the event to
// an SSE client.
func TestStreamsWakeOtherNode(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	a, prefix := openTestStore(t)
	b := openPrefix(t, prefix)
	_, url := tailingHub(t, b)
	frames := sseFrames(t, ctx, url, "")
	h, err := b.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The listener is up (it read the head) before the append.
	if err := b.WaitForAppend(ctx, h-1); err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		woke <- b.WaitForAppend(wctx, h)
	}()
	err = a.UpdateStreams(ctx, []string{"s"}, func(tx storage.StreamTx) error {
		if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "s", Meta: []byte("m")}); err != nil {
			return err
		}
		_, err := tx.Append(ctx, []storage.Event{ev("wake-1", "s", `{"id":"wake-1"}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatalf("WaitForAppend on the other node: %v", err)
	}
	framesUntil(t, frames, "wake-1", 10*time.Second)
}

// An event id already stored is a duplicate in a stream transaction as in
// Append (the transaction rolls back to its savepoint and looks the ids
// up), and the writes queued before the append stay in the transaction.
func TestStreamsAppendDuplicate(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	s, _ := openTestStore(t)
	orig := mustAppend(t, s, ev("dup-1", "s", `"first"`))[0].Event
	var res []storage.AppendResult
	err := s.UpdateStreams(ctx, []string{"s"}, func(tx storage.StreamTx) error {
		if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "s", Meta: []byte("m")}); err != nil {
			return err
		}
		var err error
		res, err = tx.Append(ctx, []storage.Event{ev("dup-1", "s", `"again"`), ev("dup-2", "s", `"new"`)})
		if err != nil {
			return err
		}
		return tx.PutProducer(ctx, "s", "p", []byte("state"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Duplicate || res[0].Event.Sequence != orig.Sequence || string(res[0].Event.Payload) != `"first"` ||
		res[1].Duplicate || res[1].Event.Sequence <= orig.Sequence {
		t.Fatalf("results %+v; original %+v", res, orig)
	}
	p, err := s.ReadStream(ctx, storage.StreamReadRequest{Topic: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Found || len(p.Events) != 2 || p.Events[1].EventID != "dup-2" {
		t.Fatalf("ReadStream: %+v", p)
	}
}

// A stream transaction that appended and then rolled back leaves the
// sequence floor alone: the next append takes the next sequence, where a
// store that counted the rolled-back sequences as issued would take the
// head for a replaced log's and raise the floor (floorGuard).
func TestStreamsRollbackKeepsFloor(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	s, _ := openTestStore(t)
	h := mustAppend(t, s, ev("rb-0", "s", `0`))[0].Event.Sequence
	boom := errors.New("boom")
	err := s.UpdateStreams(ctx, []string{"s"}, func(tx storage.StreamTx) error {
		if _, err := tx.Append(ctx, []storage.Event{ev("rb-1", "s", `1`), ev("rb-2", "s", `2`)}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("UpdateStreams: %v, want fn's error", err)
	}
	next := mustAppend(t, s, ev("rb-3", "s", `3`))[0].Event
	if next.Sequence != h+1 {
		t.Fatalf("the append after a rolled-back stream transaction got %d, want %d", next.Sequence, h+1)
	}
}

// fn runs again after a serialisation failure or a deadlock (here fn's
// own, as a statement of its transaction would return it), with nothing
// of the failed call stored, and only then; at most streamRetries times
// more.
func TestStreamsRetry(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	s, _ := openTestStore(t)
	calls := 0
	err := s.UpdateStreams(ctx, []string{"s"}, func(tx storage.StreamTx) error {
		calls++
		if _, err := tx.Append(ctx, []storage.Event{ev(fmt.Sprintf("retry-%d", calls), "s", `1`)}); err != nil {
			return err
		}
		if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "s", Meta: []byte(strconv.Itoa(calls))}); err != nil {
			return err
		}
		if calls < 3 {
			return fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "ERROR", Code: []string{"40001", "40P01"}[calls-1]})
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("UpdateStreams: %v after %d calls, want nil after 3", err, calls)
	}
	p, err := s.ReadStream(ctx, storage.StreamReadRequest{Topic: "s"})
	if err != nil || !p.Found || string(p.Record.Meta) != "3" || len(p.Events) != 1 || p.Events[0].EventID != "retry-3" {
		t.Fatalf("ReadStream: %+v, %v", p, err)
	}
	calls = 0
	err = s.UpdateStreams(ctx, []string{"s"}, func(tx storage.StreamTx) error {
		calls++
		return &pgconn.PgError{Severity: "ERROR", Code: "40001"}
	})
	if !retryable(err) || calls != streamRetries+1 {
		t.Fatalf("UpdateStreams always failing: %v after %d calls, want a serialisation failure after %d", err, calls, streamRetries+1)
	}
	calls = 0
	err = s.UpdateStreams(ctx, []string{"s"}, func(tx storage.StreamTx) error {
		calls++
		return &pgconn.PgError{Severity: "ERROR", Code: "23505"}
	})
	if err == nil || calls != 1 {
		t.Fatalf("UpdateStreams failing otherwise: %v after %d calls, want 1", err, calls)
	}
}
