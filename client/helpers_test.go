package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// server is a hub on a SQLite file in a temporary directory, served over
// real HTTP at /events and /poll. The hub can be replaced by a new one on
// the same file at the same address (restart), and every request can go
// through a wrapper (wrap) that the test swaps at any time.
type server struct {
	t    testing.TB
	path string
	opts replayd.Options
	hub  atomic.Pointer[replayd.EventHub]
	wrap atomic.Pointer[func(http.Handler) http.Handler]
	srv  *httptest.Server

	mu     sync.Mutex
	closes []func()
}

func newServer(t testing.TB, opts replayd.Options) *server {
	t.Helper()
	if opts.SSE.OverloadRetry == 0 {
		// A request that lands on a closing hub (restart) is told to
		// retry after 1x-2x OverloadRetry, as an overloaded one is; the
		// default, 5 s, would make every restart cost the test 5-10 s.
		opts.SSE.OverloadRetry = 100 * time.Millisecond
	}
	s := &server{t: t, path: filepath.Join(t.TempDir(), "events.db"), opts: opts}
	s.open()
	mux := http.NewServeMux()
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) { s.hub.Load().Handler().ServeHTTP(w, r) })
	mux.HandleFunc("/poll", func(w http.ResponseWriter, r *http.Request) { s.hub.Load().PollHandler().ServeHTTP(w, r) })
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h http.Handler = mux
		if wrap := s.wrap.Load(); wrap != nil {
			h = (*wrap)(mux)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		s.srv.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range slices.Backward(s.closes) {
			c()
		}
	})
	return s
}

// open opens a hub on the file and makes it the one served.
func (s *server) open() {
	s.t.Helper()
	db, err := replayd.OpenDB(s.path)
	if err != nil {
		s.t.Fatal(err)
	}
	h, err := replayd.New(db, s.opts)
	if err != nil {
		db.Close()
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.closes = append(s.closes, func() { db.Close() }, func() { h.Close() })
	s.mu.Unlock()
	s.hub.Store(h)
}

// restart closes the hub (ending every stream and waiting poll) and opens
// a new one on the same file, served at the same address.
func (s *server) restart() {
	s.t.Helper()
	if err := s.hub.Load().Close(); err != nil {
		s.t.Fatal(err)
	}
	s.open()
}

func (s *server) setWrap(w func(http.Handler) http.Handler) {
	if w == nil {
		s.wrap.Store(nil)
		return
	}
	s.wrap.Store(&w)
}

func (s *server) options(transport client.Transport, topics ...string) client.Options {
	return client.Options{
		SSE: s.srv.URL + "/events", Poll: s.srv.URL + "/poll", Transport: transport, Topics: topics,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, PollWait: 2 * time.Second,
	}
}

// publish publishes n events on topic and returns them.
func (s *server) publish(n int, topic string) []replayd.Event {
	s.t.Helper()
	out := make([]replayd.Event, 0, n)
	for i := range n {
		ev, err := s.hub.Load().Publish(context.Background(), topic, map[string]any{"n": i, "topic": topic})
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

// recorder keeps what a client's handler was handed, and checks as it
// goes that event ids only go up.
type recorder struct {
	mu      sync.Mutex
	msgs    []client.Message
	last    int64
	err     error         // the first violation seen
	changed chan struct{} // closed and replaced on every message
	refuse  func(client.Message) error
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) handle(m client.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse != nil {
		if err := r.refuse(m); err != nil {
			return err
		}
	}
	if (m.Event == nil) == (m.Gap == nil) && r.err == nil {
		r.err = fmt.Errorf("message %+v: want exactly one of Event and Gap", m)
	}
	if m.Event != nil {
		if m.Event.ID <= r.last && r.err == nil {
			r.err = fmt.Errorf("event %d after %d", m.Event.ID, r.last)
		}
		r.last = m.Event.ID
	}
	if m.Gap != nil && m.Gap.Reason == "unknown_cursor" {
		r.last = 0 // another history starts
	}
	r.msgs = append(r.msgs, m)
	close(r.changed)
	r.changed = make(chan struct{})
	return nil
}

// waitFor waits until the recorder has handled an event with id at least
// seq (or a gap naming it), failing the test after wiretest.WaitFor.
func (r *recorder) waitFor(t *testing.T, seq int64) {
	t.Helper()
	timer := time.NewTimer(wiretest.WaitFor)
	defer timer.Stop()
	for {
		r.mu.Lock()
		done := r.reached(seq)
		ch := r.changed
		r.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("timed out waiting for event %d; got %s", seq, r)
		}
	}
}

func (r *recorder) reached(seq int64) bool {
	for _, m := range slices.Backward(r.msgs) {
		if m.Event != nil && m.Event.ID >= seq {
			return true
		}
		if m.Gap != nil && m.Gap.MissedThrough != nil && *m.Gap.MissedThrough >= seq {
			return true
		}
	}
	return false
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.describe()
}

// describe lists the messages; r.mu is held.
func (r *recorder) describe() string {
	s := fmt.Sprintf("%d messages:", len(r.msgs))
	for i, m := range r.msgs {
		if i == 40 {
			s += " ..."
			break
		}
		switch {
		case m.Event != nil:
			s += fmt.Sprintf(" %d", m.Event.ID)
		case m.Gap != nil:
			s += fmt.Sprintf(" gap(%s %v-%v)", m.Gap.Reason, deref(m.Gap.MissedFrom), deref(m.Gap.MissedThrough))
		}
	}
	return s
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// check asserts the guarantee over what the recorder holds: ids strictly
// increasing, each event one of want with its type and data, and every
// event of want above from either handed once or inside a gap's range
// handed before the next event.
func (r *recorder) check(t *testing.T, want []replayd.Event, from int64) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		t.Fatal(r.err)
	}
	got := map[int64]*client.Event{}
	type span struct{ from, through int64 }
	var gaps []span
	for _, m := range r.msgs {
		if m.Event != nil {
			if got[m.Event.ID] != nil {
				t.Fatalf("event %d handed twice", m.Event.ID)
			}
			got[m.Event.ID] = m.Event
		}
		if m.Gap != nil && m.Gap.MissedFrom != nil && m.Gap.MissedThrough != nil {
			gaps = append(gaps, span{*m.Gap.MissedFrom, *m.Gap.MissedThrough})
		}
	}
	for _, ev := range want {
		if ev.Sequence <= from {
			continue
		}
		g := got[ev.Sequence]
		if g == nil {
			if !slices.ContainsFunc(gaps, func(s span) bool { return s.from <= ev.Sequence && ev.Sequence <= s.through }) {
				t.Fatalf("event %d neither handed nor in a gap; got %s", ev.Sequence, r.describe())
			}
			continue
		}
		if g.Type != ev.Type || string(g.Data) != string(ev.Payload) {
			t.Fatalf("event %d: got %s %s, want %s %s", ev.Sequence, g.Type, g.Data, ev.Type, ev.Payload)
		}
		if g.HasTopic && g.Topic != ev.Topic {
			t.Fatalf("event %d: topic %q, want %q", ev.Sequence, g.Topic, ev.Topic)
		}
	}
}

// run runs c in a goroutine until the test ends; the returned function
// stops it and returns Run's error.
func run(t *testing.T, c *client.Client, r *recorder) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx, r.handle) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(wiretest.WaitFor):
				err = errors.New("Run did not return after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// proxy is a TCP proxy in front of a server that spoils what it relays:
// it cuts each connection after a random number of bytes from the server
// (mid-frame, mid-header, mid-answer), or delays each chunk.
type proxy struct {
	l       net.Listener
	backend string
	cutMin  int           // cut after cutMin..2*cutMin bytes from the server; 0: never
	delay   time.Duration // sleep before relaying each chunk from the server
	rng     *rand.Rand
	mu      sync.Mutex // guards rng and conns
	conns   []net.Conn
	wg      sync.WaitGroup
	cuts    atomic.Int64
}

func newProxy(t *testing.T, backend string, cutMin int, delay time.Duration) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(backend)
	p := &proxy{l: l, backend: u.Host, cutMin: cutMin, delay: delay, rng: rand.New(rand.NewPCG(1, 2))}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) URL() string { return "http://" + p.l.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.backend)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, b)
		budget := -1
		if p.cutMin > 0 {
			budget = p.cutMin + p.rng.IntN(p.cutMin+1)
		}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			io.Copy(b, c)
			b.Close()
		}()
		go func() {
			defer p.wg.Done()
			defer c.Close()
			defer b.Close()
			buf := make([]byte, 512)
			for {
				n, err := b.Read(buf)
				if budget >= 0 && n > budget {
					n = budget
				}
				if n > 0 {
					if p.delay > 0 {
						time.Sleep(p.delay)
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
					if budget >= 0 {
						if budget -= n; budget == 0 {
							p.cuts.Add(1)
							return
						}
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// scripted is a server that misbehaves exactly as a test writes it: answer
// writes the answer to each request, given its number (from 1) and the
// cursor it carries (Last-Event-ID, or the poll's cursor parameter; -1:
// none). hold keeps a request open until the client goes away.
type scripted struct {
	srv *httptest.Server

	mu      sync.Mutex // guards cursors
	cursors []int64    // each request's cursor, in order of arrival
}

func newScripted(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int, cursor int64)) *scripted {
	t.Helper()
	s := &scripted{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cursor := int64(-1)
		v := r.Header.Get("Last-Event-ID")
		if r.URL.Path == "/poll" {
			v = r.URL.Query().Get("cursor")
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			cursor = n
		}
		s.mu.Lock()
		s.cursors = append(s.cursors, cursor)
		n := len(s.cursors)
		s.mu.Unlock()
		switch r.URL.Path {
		case "/poll":
			w.Header().Set("Content-Type", "application/json")
		default:
			w.Header().Set("Content-Type", "text/event-stream")
		}
		answer(w, r, n, cursor)
	}))
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
	return s
}

func (s *scripted) options(transport client.Transport) client.Options {
	return client.Options{
		SSE: s.srv.URL + "/events", Poll: s.srv.URL + "/poll", Transport: transport,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, PollWait: 2 * time.Second,
	}
}

// requests returns the cursor of each request so far.
func (s *scripted) requests() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.cursors)
}

// hold keeps the request open, its headers sent, until the client goes away.
func hold(w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}
