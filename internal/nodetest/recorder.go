package nodetest

import (
	"context"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/storage"
)

// Recorder reads the log as it grows, every 20 ms, into a Truth's ledger,
// so that rows pruned before the end are still known.
type Recorder struct {
	ctx     context.Context
	tr      *Truth
	s       storage.Store
	onRow   func(replayd.Event)
	outages bool
	after   int64
	stop    chan struct{}
	done    chan struct{}
}

// Record starts a Recorder on s (a store of the test's on the nodes' log)
// until ctx ends or Stop. onRow, if not nil, sees every row too. With
// outages a read that fails is retried at the next tick (the store may be
// down); without, it is a failure of tr.
func Record(ctx context.Context, tr *Truth, s storage.Store, onRow func(replayd.Event), outages bool) *Recorder {
	r := &Recorder{ctx: ctx, tr: tr, s: s, onRow: onRow, outages: outages, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := r.once(); err != nil && !outages {
					tr.Fail("recorder: %v", err)
				}
			}
		}
	}()
	return r
}

func (r *Recorder) once() error {
	for {
		p, err := r.s.Read(r.ctx, storage.ReadRequest{After: r.after, Limit: 1000})
		if err != nil {
			return err
		}
		if len(p.Events) == 0 {
			return nil
		}
		for _, ev := range p.Events {
			r.tr.Ledger.Logged(ev)
			if r.onRow != nil {
				r.onRow(ev)
			}
		}
		r.after = p.Events[len(p.Events)-1].Sequence
	}
}

// Stop stops the loop and reads the rest of the log; its error is that
// last read's. Stop is for once; Close after it is a no-op.
func (r *Recorder) Stop() error {
	r.Close()
	return r.once()
}

// Close stops the loop, if it runs, and waits for it.
func (r *Recorder) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}
