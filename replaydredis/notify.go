package replaydredis

// WaitForAppend and its listener (the package doc, "Waking StartTail").

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// listenBlock is how long one XREAD of the listener blocks.
const listenBlock = 5 * time.Second

// WaitForAppend returns nil once the head may be above after (see
// storage.Notifier). The first call starts the listener.
func (s *Store) WaitForAppend(ctx context.Context, after int64) error {
	s.listenOnce.Do(func() { go s.listen() })
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return ErrClosed
		}
		known, ch := s.known, s.changed
		s.mu.Unlock()
		if known > after {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// setKnown records the head the listener read and wakes the waiters if
// it moved.
func (s *Store) setKnown(h int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || h == s.known {
		return
	}
	s.known = h
	close(s.changed)
	s.changed = make(chan struct{})
}

// listen reads the head, then blocks in XREAD on the stream above it; an
// entry, or the block's end, reads the head again. It runs on the
// listener's own client until Close closes it.
func (s *Store) listen() {
	defer close(s.listenDone)
	ctx := s.ctx
	var (
		known   int64
		backoff time.Duration
	)
	for ctx.Err() == nil {
		h, err := s.lc.Get(ctx, s.p+"head").Int64()
		if errors.Is(err, redis.Nil) {
			h, err = 0, nil
		}
		if err == nil {
			known, backoff = h, 0
			s.setKnown(h)
			_, err = s.lc.XRead(ctx, &redis.XReadArgs{
				Streams: []string{s.p + "log", i64(known) + "-0"},
				Count:   1,
				Block:   listenBlock,
			}).Result()
			if errors.Is(err, redis.Nil) {
				err = nil // the block ended
			}
		}
		if err != nil && ctx.Err() == nil {
			// Redis is down or restarting: retry, backing off to a second.
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}
}
