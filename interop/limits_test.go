package interop

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	r3sse "github.com/r3labs/sse/v2"
	"gopkg.in/cenkalti/backoff.v1"

	"github.com/replayd/replayd"
)

// Two limits of the Go clients that docs/clients.md names: the scanner's
// 64 KiB, and r3labs/sse's back-off clock.

// A payload is sent on one data: line, so an event of more than 64 KiB
// passes the default limit of a bufio.Scanner, which r3labs/sse and
// tmaxmax/go-sse read with. The client then fails on that event, reconnects
// from the event before it, and fails again: it never gets past it.
func TestBigPayload(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	for _, tc := range []struct {
		client    client
		delivered bool
	}{
		{client{"r3labs/sse", r3labs()}, false},
		{client{"r3labs/sse ClientMaxBufferSize(2 MiB)", r3labs(r3sse.ClientMaxBufferSize(2 << 20))}, true},
		{client{"tmaxmax/go-sse", goSSE(0)}, false},
		{client{"tmaxmax/go-sse Buffer(nil, 2 MiB)", goSSE(2 << 20)}, true},
		{client{"launchdarkly/eventsource", runLaunchDarkly}, true},
		{client{"npm eventsource", runNode}, true},
	} {
		t.Run(tc.client.name, func(t *testing.T) {
			if strings.HasPrefix(tc.client.name, "npm") {
				nodeDir(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			s := newSite(t, replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1, Retry: 100 * time.Millisecond}})
			rec := runClient(t, ctx, tc.client, s.srv.URL+"/?topic=t")
			s.publishOne(ctx, map[string]int{"n": 1})
			s.publishOne(ctx, map[string]string{"big": big})
			s.publishOne(ctx, map[string]int{"n": 3})
			// Either the events after the big one arrive, or the client
			// has come back twice for it.
			wait, stop := context.WithTimeout(ctx, comeBackTime)
			defer stop()
			again := func() bool { return s.front.logLen() >= 3 }
			untilEither(wait, &rec.board, &s.front.board, func() bool {
				frames, stopped, _ := rec.snapshot()
				return stopped || hasMessage(frames, fmt.Sprint(s.published[2])) || again()
			})
			frames, stopped, err := rec.snapshot()
			delivered := false
			for _, f := range frames {
				delivered = delivered || f.typ == "message" && f.id == fmt.Sprint(s.published[1]) && strings.Contains(f.data, big)
			}
			t.Logf("delivered %v, requests %d, stopped %v (%v)", delivered, s.front.logLen(), stopped, err)
			if delivered != tc.delivered {
				t.Errorf("%s: 100 KiB event delivered: %v; docs/clients.md says %v", tc.client.name, delivered, tc.delivered)
			}
			if !delivered && !again() {
				t.Errorf("%s: did not come back for the event it could not read", tc.client.name)
			}
		})
	}
}

// r3labs/sse resets its back-off only when Subscribe starts, so the
// back-off's MaxElapsedTime (15 minutes by default) counts from the
// subscription's start, not from the last good connection: once a
// subscription is older than that, its first error ends it, with no
// reconnect at all. Measured here with MaxElapsedTime at 300 ms.
func TestR3labsBackOffClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	s := newSite(t, replayd.Options{SSE: replayd.SSEOptions{HeartbeatInterval: -1}})
	px := newProxy(t, s.srv.Listener.Addr().String())
	const maxElapsed = 300 * time.Millisecond
	run := func(ctx context.Context, t *testing.T, url string, rec *recorder) {
		c := r3sse.NewClient(url)
		b := backoff.NewExponentialBackOff()
		b.MaxElapsedTime = maxElapsed
		c.ReconnectStrategy = backoff.WithContext(b, ctx)
		err := c.SubscribeRawWithContext(ctx, func(m *r3sse.Event) {
			rec.add(string(m.Event), string(m.ID), string(m.Data))
		})
		if ctx.Err() == nil {
			rec.stop(fmt.Errorf("Subscribe returned %v", err))
		}
	}
	rec := runClient(t, ctx, client{"r3labs/sse", run}, "http://"+px.addr()+"/?topic=t")
	s.publish(ctx, 1)
	if !rec.until(ctx, func() bool { return rec.has(fmt.Sprint(s.published[0])) }) {
		t.Fatal("event 1 not delivered")
	}
	// The stream stays up past MaxElapsedTime: the passing time is the
	// scenario here, nothing is waited for.
	time.Sleep(2 * maxElapsed)
	s.publish(ctx, 1)
	if !rec.until(ctx, func() bool { return rec.has(fmt.Sprint(s.published[1])) }) {
		t.Fatal("event 2 not delivered")
	}
	px.cut()
	wait, stop := context.WithTimeout(ctx, comeBackTime)
	defer stop()
	stopped := rec.until(wait, func() bool { return rec.stopped })
	_, _, err := rec.snapshot()
	t.Logf("stopped %v (%v), requests %d", stopped, err, s.front.logLen())
	if !stopped || s.front.logLen() != 1 {
		t.Errorf("r3labs/sse: stopped %v after %d requests; docs/clients.md says it gives up at its first error, without a reconnect", stopped, s.front.logLen())
	}
}

// r3labs/sse's default ReconnectStrategy does not watch the context given
// to SubscribeWithContext: cancelled while the server is unreachable, the
// subscription goes on retrying until the back-off's MaxElapsedTime (15
// minutes by default; 1 s here). backoff.WithContext ends it at once.
func TestR3labsCancelWhileDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/"
	ln.Close() // nothing listens: every attempt is refused
	for _, tc := range []struct {
		name        string
		withContext bool
		retriesOn   bool // attempts after the cancel
	}{
		{"default", false, true},
		{"backoff.WithContext", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b := backoff.NewExponentialBackOff()
			b.InitialInterval = 50 * time.Millisecond
			b.MaxElapsedTime = time.Second
			c := r3sse.NewClient(url)
			c.ReconnectStrategy = b
			if tc.withContext {
				c.ReconnectStrategy = backoff.WithContext(b, ctx)
			}
			var (
				mu        sync.Mutex
				cancelled bool // guarded by mu
				attempts  int  // guarded by mu: retries notified after the cancel
				once      sync.Once
			)
			first := make(chan struct{})
			c.ReconnectNotify = func(error, time.Duration) {
				once.Do(func() { close(first) })
				mu.Lock()
				defer mu.Unlock()
				if cancelled {
					attempts++
				}
			}
			done := make(chan error, 1)
			go func() { done <- c.SubscribeRawWithContext(ctx, func(*r3sse.Event) {}) }()
			select {
			case <-first:
			case <-time.After(5 * time.Second):
				t.Fatal("no attempt")
			}
			mu.Lock()
			cancelled = true
			mu.Unlock()
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Subscribe still running 5 s after its context ended")
			}
			mu.Lock()
			after := attempts
			mu.Unlock()
			t.Logf("attempts after the cancel: %d", after)
			if (after > 0) != tc.retriesOn {
				t.Errorf("%d attempts after the cancel; docs/clients.md says some: %v", after, tc.retriesOn)
			}
		})
	}
}
