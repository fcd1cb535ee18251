package replayd

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/storage"
)

// DurableStreamsOptions configures the handler returned by
// EventHub.DurableStreams. See docs/durable-streams.md in the repository.
type DurableStreamsOptions struct {
	// Prefix is the path the handler is mounted at; default "/v1/stream/".
	// A stream's name is the request path after it.
	Prefix string
	// TopicPrefix is put before a stream's name to make its topic; default
	// "": the stream /v1/stream/chat/42 is the topic "chat/42".
	TopicPrefix string
	// AuthorizeRead decides GET and HEAD of a stream's topic;
	// AuthorizeWrite decides PUT, POST and DELETE. A nil error allows the
	// request; an error refuses it with 401 when errors.Is(err,
	// ErrUnauthenticated), else 403. A nil AuthorizeRead falls back to
	// Options.Authorize with the one topic; a nil AuthorizeWrite refuses
	// every write with 403, unless Open is set.
	AuthorizeRead, AuthorizeWrite func(r *http.Request, topic string) error
	// Open allows every read and write that no Authorize function decides,
	// from any origin (Access-Control-Allow-Origin: *): for local
	// development and the protocol's conformance suite. Never set it on a
	// server others can reach. Otherwise origins follow SSEOptions'
	// AllowedOrigins, as for Handler().
	Open bool
	// MaxBody bounds a request body (PUT, POST); default 8 MiB, answered
	// 413 above it.
	MaxBody int64
}

// DurableStreams returns an http.Handler that serves the Durable Streams
// protocol (https://github.com/durable-streams/durable-streams) over the
// hub's log: mount it at opts.Prefix. A stream is a topic: its messages are
// events of the log, with the same ids, that Handler(), PollHandler() and
// every client of the hub read too; an offset is an event's sequence,
// written as 19 digits. Stream metadata and idempotent producers' state
// are committed in the same transaction as the events. Over a store that
// is not a storage.StreamStore it answers 501.
func (h *EventHub) DurableStreams(opts DurableStreamsOptions) http.Handler {
	ss, ok := h.store.(storage.StreamStore)
	if !ok {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "this hub's store does not keep Durable Streams", http.StatusNotImplemented)
		})
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "/v1/stream/"
	}
	read, write := opts.AuthorizeRead, opts.AuthorizeWrite
	if read == nil && h.opts.Authorize != nil {
		read = func(r *http.Request, topic string) error { return h.opts.Authorize(r, []string{topic}) }
	}
	if write == nil && !opts.Open {
		write = func(*http.Request, string) error { return errWritesClosed }
	}
	allow := h.allowOrigin
	if opts.Open {
		allow = func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Access-Control-Allow-Origin", "*")
			return true
		}
	}
	prune := h.durablePrune()
	h.startDurableSweep(ss, prune)
	return durable.New(durable.Config{
		Store:           ss,
		Live:            h.live,
		Deliver:         h.deliverCommitted,
		Prefix:          prefix,
		TopicPrefix:     opts.TopicPrefix,
		DataType:        h.opts.DefaultType,
		AuthorizeRead:   read,
		AuthorizeWrite:  write,
		Unauthenticated: ErrUnauthenticated,
		AllowOrigin:     allow,
		AcquireSlot:     h.acquireSlot,
		Done:            h.done,
		Logger:          h.logger,
		MaxWait:         h.opts.Poll.MaxWait,
		MaxBody:         opts.MaxBody,
		Prune:           prune,
		Reading:         func(topic string) func() { return h.reading([]string{topic}) },
		Now:             time.Now,
	})
}

// The sweep of Durable Streams (internal/durable/sweep.go) reclaims the
// records and the events of deleted and expired streams: the hub runs it
// from the first DurableStreams call until Close, one round at once and
// then every durableSweepInterval, each round at most durableSweepBatch
// streams (a full round is followed by the next after durableSweepPause).
// The protocol's API has no knob for it: a minute bounds how long a dead
// stream's events outlive it, and costs an index probe a minute when
// nothing is due. Every node of a shared store sweeps; each step is
// checked in the stream's transaction and pruning is idempotent.
const (
	durableSweepInterval = time.Minute
	durableSweepPause    = time.Second
	durableSweepBatch    = 100
)

// durablePrune is the sweep's pruning: PruneTopic, when the store is a
// storage.TopicPruner; nil leaves a dead stream's events to retention.
func (h *EventHub) durablePrune() func(ctx context.Context, topic string, through int64) (int64, error) {
	if _, ok := h.store.(storage.TopicPruner); !ok {
		return nil
	}
	return h.PruneTopic
}

// startDurableSweep starts the sweep over ss, once per hub.
func (h *EventHub) startDurableSweep(ss storage.StreamStore, prune func(context.Context, string, int64) (int64, error)) {
	h.mu.Lock()
	if h.sweeping || h.closed {
		h.mu.Unlock()
		return
	}
	h.sweeping = true
	h.mu.Unlock()
	s := &durable.Sweeper{Store: ss, Prune: prune, Now: time.Now}
	_ = h.goLoop(func() {
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-h.ctx.Done():
				return
			case <-t.C:
			}
			full, err := h.sweepDurable(h.ctx, s)
			switch {
			case err != nil && h.ctx.Err() == nil:
				h.logger.Error("replayd: durable streams: sweep failed", "err", err)
				t.Reset(durableSweepInterval)
			case full:
				t.Reset(durableSweepPause)
			default:
				t.Reset(durableSweepInterval)
			}
		}
	})
}

// sweepDurable runs one round of s; full reports that it listed a full
// batch (more may be due).
func (h *EventHub) sweepDurable(ctx context.Context, s *durable.Sweeper) (full bool, err error) {
	listed, pruned, err := s.Round(ctx, durableSweepBatch)
	if pruned > 0 {
		h.logger.Info("replayd: durable streams: reclaimed deleted and expired streams", "due", listed, "events", pruned)
	}
	return listed == durableSweepBatch, err
}

var errWritesClosed = errors.New("replayd: durable streams: writes need DurableStreamsOptions.AuthorizeWrite (or Open)")
