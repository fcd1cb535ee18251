package replaydpg

// Wake-ups (storage.Notifier): every append's statement notifies the log's
// channel of the new head (append.go), and WaitForAppend waits for it on
// the listener, one session-level connection that LISTENs.

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// WaitForAppend returns nil once the head is above after, as far as this
// store's listener knows: at once if it knows so already, otherwise when a
// notification of a batch above after arrives, or when the listener
// (re)connects and reads such a head. It returns ctx's error when ctx ends
// first, and ErrClosed when the store closes. The listener is a dedicated
// connection opened by the first call; it LISTENs before it reads the head
// on every (re)connect, so no batch falls between. A notification can still
// be delayed without bound by a network fault: callers keep a fallback poll.
func (s *Store) WaitForAppend(ctx context.Context, after int64) error {
	s.listenOnce.Do(func() { go s.listen() })
	for {
		s.mu.Lock()
		known, ch, closed := s.known, s.changed, s.closed
		s.mu.Unlock()
		switch {
		case closed:
			return ErrClosed
		case known > after:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ctx.Done():
			return ErrClosed
		case <-ch:
		}
	}
}

// report records a head the listener learnt and wakes the waiters.
func (s *Store) report(head int64) {
	s.saw(head)
	s.mu.Lock()
	defer s.mu.Unlock()
	if head <= s.known {
		return
	}
	s.known = head
	close(s.changed)
	s.changed = make(chan struct{})
}

// listen keeps one LISTEN connection open until Close, reconnecting with a
// capped back-off.
func (s *Store) listen() {
	defer close(s.listenDone)
	wait := 50 * time.Millisecond
	for {
		connected, _ := s.listenConn()
		if connected {
			wait = 50 * time.Millisecond
		}
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// listenConn connects, LISTENs, reads the head, and then reports every
// notification until the connection fails or the store closes.
func (s *Store) listenConn() (connected bool, err error) {
	conn, err := pgx.ConnectConfig(s.ctx, s.connCfg)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(s.ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return false, err
	}
	var head int64
	if err := conn.QueryRow(s.ctx, s.q.head).Scan(&head); err != nil {
		return false, err
	}
	s.report(head)
	for {
		n, err := conn.WaitForNotification(s.ctx)
		if err != nil {
			return true, err
		}
		if h, err := strconv.ParseInt(n.Payload, 10, 64); err == nil {
			s.report(h)
		}
	}
}
