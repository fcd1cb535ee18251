package sqlitestore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/replayd/replayd/storage"
)

// TestUpdateStreamsGroupCommit runs many concurrent UpdateStreams calls,
// a third of them failing after they wrote: the batches they share commit
// the others alone, each seeing the effects of those before it (no lost
// update of the counter), and nothing of a failed call is stored.
func TestUpdateStreamsGroupCommit(t *testing.T) {
	db, _ := openTestDB(t)
	s, err := Open(db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	errRefused := errors.New("refused")
	const calls = 90
	var wg sync.WaitGroup
	var mu sync.Mutex
	var refused, ok int
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.UpdateStreams(ctx, []string{"c"}, func(tx storage.StreamTx) error {
				rec, _, err := tx.Stream(ctx, "c")
				if err != nil {
					return err
				}
				n, _ := strconv.Atoi(string(rec.Meta))
				if err := tx.PutStream(ctx, storage.StreamRecord{Topic: "c", Meta: []byte(strconv.Itoa(n + 1))}); err != nil {
					return err
				}
				if _, err := tx.Append(ctx, []storage.Event{{EventID: "e" + strconv.Itoa(i), Type: "message", Topic: "c", Payload: []byte(strconv.Itoa(i))}}); err != nil {
					return err
				}
				if i%3 == 0 {
					return errRefused
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, errRefused):
				refused++
			case err == nil:
				ok++
			default:
				t.Errorf("call %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if refused != calls/3 || ok != calls-calls/3 {
		t.Fatalf("%d refused, %d committed; want %d and %d", refused, ok, calls/3, calls-calls/3)
	}
	p, err := s.ReadStream(ctx, storage.StreamReadRequest{Topic: "c", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(p.Record.Meta); got != strconv.Itoa(ok) {
		t.Errorf("counter = %s, want %d: an update was lost or a refused one kept", got, ok)
	}
	if len(p.Events) != ok {
		t.Errorf("%d events stored, want %d", len(p.Events), ok)
	}
	for _, ev := range p.Events {
		if n, _ := strconv.Atoi(string(ev.Payload)); n%3 == 0 {
			t.Errorf("the event of refused call %d is stored", n)
		}
	}
}
