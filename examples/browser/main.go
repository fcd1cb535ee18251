// Command browser serves a small page that shows replayd from a browser's
// point of view: a live per-topic feed from an EventSource, the current
// cursor (the last event id), buttons that make the server drop the page's
// connection, and a visible notice when a gap arrives, after which the page
// re-syncs from a snapshot endpoint.
//
// It is a module of its own, so that the replayd module does not depend on
// Prometheus. Run it with
//
//	cd examples/browser && go run .
//
// and open http://127.0.0.1:8080/ (-addr changes the address). A background
// publisher writes an event about every second on a few topics, and now
// and then a broadcast. The database lives in a temporary directory that is
// removed at exit, unless -db names a file.
//
// Endpoints:
//
//	GET  /                     the page (index.html, embedded)
//	GET  /events?topic=T…      the replayd SSE endpoint, on one or several topics
//	                           (repeat topic; none: every topic); the page adds client=ID
//	GET  /snapshot?topic=T…    recent events visible to those topics and the cursor
//	                           to resume from
//	POST /drop?client=ID[&away=10s]
//	                           end that page's stream server side; with away, hold
//	                           its reconnects that long, so it misses events
//	GET  /stats                the hub's Stats: head and connections per topic
//	GET  /metrics              the hub's metrics for Prometheus (replaydprom)
//	GET  /readyz               the hub's readiness: 200 "ok" or 503
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydprom"
)

//go:embed index.html
var indexHTML []byte

// Topics the publisher writes to, besides broadcasts.
var topics = []string{"sports", "weather", "markets"}

const (
	replayLimit  = 5  // small, so a page held away for a few seconds gets a gap
	snapshotSize = 15 // events a snapshot returns
	maxAway      = 60 * time.Second
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	dbPath := flag.String("db", "", "SQLite file for the event log (default: a temporary file removed at exit)")
	every := flag.Duration("every", time.Second, "how often the background publisher publishes")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err == nil {
		err = run(ctx, logger, ln, *dbPath, *every)
	}
	if err != nil {
		logger.Error("browser demo", "err", err)
		stop()
		os.Exit(1)
	}
}

// run serves the demo on ln until ctx ends.
func run(ctx context.Context, logger *slog.Logger, ln net.Listener, dbPath string, every time.Duration) error {
	if dbPath == "" {
		dir, err := os.MkdirTemp("", "replayd-browser-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dbPath = filepath.Join(dir, "events.db")
	}
	db, err := replayd.OpenDB(dbPath)
	if err != nil {
		return err
	}
	defer db.Close()

	hub, err := replayd.New(db, replayd.Options{
		Logger: logger,
		SSE: replayd.SSEOptions{
			ReplayLimit:       replayLimit,
			Retry:             time.Second,
			HeartbeatInterval: 10 * time.Second,
		},
	})
	if err != nil {
		return err
	}
	defer hub.Close() // runs before db.Close: ends every stream first
	stopRetention := hub.StartRetention(replayd.RetentionPolicy{MaxEvents: 10000}, time.Minute)
	defer stopRetention()

	d := &demo{hub: hub, logger: logger, clients: make(map[string]*client)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(indexHTML)
	})
	mux.HandleFunc("/events", d.events)
	mux.HandleFunc("GET /snapshot", d.snapshot)
	mux.HandleFunc("POST /drop", d.drop)
	mux.HandleFunc("GET /stats", d.stats)
	reg := prometheus.NewRegistry()
	if err := replaydprom.Register(reg, hub); err != nil {
		return err
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("GET /readyz", hub.ReadyHandler())

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("browser demo: open this in a browser", "url", "http://"+ln.Addr().String()+"/", "db", dbPath)

	pubDone := make(chan struct{})
	pubCtx, stopPub := context.WithCancel(ctx)
	go func() {
		defer close(pubDone)
		publish(pubCtx, logger, hub, every)
	}()

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	stopPub()
	<-pubDone
	hub.Close() // ends every SSE stream, so Shutdown need not wait for them
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutCtx); serr != nil && err == nil {
		err = serr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	logger.Info("browser demo: stopped")
	return err
}

// publish writes an event on one of the topics every tick, in turn, and a
// broadcast every seventh tick, until ctx ends.
func publish(ctx context.Context, logger *slog.Logger, hub *replayd.EventHub, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if n%7 == 0 {
			_, err = hub.Publish(ctx, "", map[string]any{
				"topic": "",
				"text":  fmt.Sprintf("Broadcast #%d: reaches every topic", n/7),
				"at":    time.Now().Format(time.TimeOnly),
			}, replayd.WithType("announcement"))
		} else {
			topic := topics[n%len(topics)]
			_, err = hub.Publish(ctx, topic, map[string]any{
				"topic": topic,
				"text":  headline(topic, n),
				"at":    time.Now().Format(time.TimeOnly),
			})
		}
		if err != nil && ctx.Err() == nil {
			logger.Warn("publish", "err", err)
		}
	}
}

func headline(topic string, n int) string {
	switch topic {
	case "sports":
		return fmt.Sprintf("Score update: home %d – away %d", n%5, n%3)
	case "weather":
		return fmt.Sprintf("Temperature now %d°C, wind %d km/h", 12+n%9, 5+n%20)
	default:
		return fmt.Sprintf("Index %d.%02d (%+d)", 4000+n%50, n%100, n%7-3)
	}
}

// demo holds the pages' streams, so /drop can end one server side.
type demo struct {
	hub    *replayd.EventHub
	logger *slog.Logger

	mu      sync.Mutex // guards clients
	clients map[string]*client
}

// client is one page, named by the client query parameter.
type client struct {
	streams   map[*http.Request]context.CancelFunc // its open streams
	awayUntil time.Time                            // reconnects wait until then
}

// events serves the SSE endpoint. It wraps the hub's handler with a
// request context it can cancel, so that /drop can end the stream from the
// server side, as a deploy or a proxy timeout would.
func (d *demo) events(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("client")
	if id == "" || len(id) > 64 {
		d.hub.Handler().ServeHTTP(w, r)
		return
	}
	// A page sent away by /drop?away=… reconnects at once (Retry), but its
	// request waits here, so it misses what is published meanwhile.
	d.mu.Lock()
	c := d.client(id)
	wait := time.Until(c.awayUntil)
	d.mu.Unlock()
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	r = r.WithContext(ctx)
	d.mu.Lock()
	c = d.client(id)
	c.streams[r] = cancel
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(c.streams, r)
		if len(c.streams) == 0 && time.Now().After(c.awayUntil) {
			delete(d.clients, id)
		}
		d.mu.Unlock()
	}()
	d.hub.Handler().ServeHTTP(w, r)
}

// client returns the record of id, creating it. d.mu must be held.
func (d *demo) client(id string) *client {
	c := d.clients[id]
	if c == nil {
		c = &client{streams: make(map[*http.Request]context.CancelFunc)}
		d.clients[id] = c
	}
	return c
}

// drop ends the streams of ?client=ID; with ?away=D its reconnects are
// held for D.
func (d *demo) drop(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("client")
	if id == "" || len(id) > 64 {
		http.Error(w, "missing or bad client", http.StatusBadRequest)
		return
	}
	var away time.Duration
	if s := r.URL.Query().Get("away"); s != "" {
		var err error
		if away, err = time.ParseDuration(s); err != nil || away < 0 || away > maxAway {
			http.Error(w, "away must be a duration between 0 and "+maxAway.String(), http.StatusBadRequest)
			return
		}
	}
	d.mu.Lock()
	c := d.client(id)
	c.awayUntil = time.Now().Add(away)
	n := len(c.streams)
	for _, cancel := range c.streams {
		cancel()
	}
	d.mu.Unlock()
	writeJSON(w, map[string]any{"dropped": n, "awayMs": away.Milliseconds()})
}

// snapshotResponse is what a page re-syncs from: the newest events visible
// to its topics, and the cursor to reopen its EventSource at.
type snapshotResponse struct {
	Topics []string        `json:"topics"` // [] for every topic
	Cursor int64           `json:"cursor"` // reopen with ?lastEventId=cursor
	Events []snapshotEvent `json:"events"` // ascending, all at or below cursor
}

type snapshotEvent struct {
	ID   int64           `json:"id"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// snapshot answers GET /snapshot?topic=T1&topic=T2…: the newest events of
// those topics and broadcasts (every event without a topic). The head is
// read first and the events are cut at it, so a stream reopened at the head
// neither repeats nor skips an event.
func (d *demo) snapshot(w http.ResponseWriter, r *http.Request) {
	var scope []string
	for _, t := range r.URL.Query()["topic"] {
		if t = strings.TrimSpace(t); t != "" && !slices.Contains(scope, t) {
			scope = append(scope, t)
		}
	}
	if len(scope) > len(topics) {
		http.Error(w, "too many topics", http.StatusBadRequest)
		return
	}
	head, err := d.hub.LatestSequence(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	// One read per topic (each holds its topic's events and broadcasts),
	// merged by sequence without repeats, newest snapshotSize kept.
	bySeq := map[int64]replayd.Event{}
	for _, topic := range scope {
		evs, err := d.hub.Log().ReplayLatest(r.Context(), topic, 0, snapshotSize)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, ev := range evs {
			bySeq[ev.Sequence] = ev
		}
	}
	if len(scope) == 0 {
		evs, err := d.hub.Log().ReplayLatest(r.Context(), "", 0, snapshotSize)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		for _, ev := range evs {
			bySeq[ev.Sequence] = ev
		}
	}
	seqs := slices.Sorted(maps.Keys(bySeq))
	seqs = seqs[max(0, len(seqs)-snapshotSize):]
	resp := snapshotResponse{Topics: append([]string{}, scope...), Cursor: head, Events: []snapshotEvent{}}
	for _, seq := range seqs {
		if ev := bySeq[seq]; seq <= head {
			resp.Events = append(resp.Events, snapshotEvent{ID: ev.Sequence, Type: ev.Type, Data: ev.Payload})
		}
	}
	writeJSON(w, resp)
}

func (d *demo) stats(w http.ResponseWriter, r *http.Request) {
	st, err := d.hub.Stats(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, st)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(v)
}
