// Package server is `replayd serve`: the library's hub behind an HTTP
// publish API and subscriber tokens, for applications not written in Go.
package server

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydpg"
	"github.com/replayd/replayd/replaydprom"
)

// DrainTimeout bounds a shutdown: streams end at once, in-flight publishes
// get the rest.
const DrainTimeout = 10 * time.Second

// Server is one serve process: a hub on its log and the HTTP handler
// around it.
type Server struct {
	hub     *replayd.EventHub
	handler http.Handler
	log     *slog.Logger
	conf    Config             // its timeouts and connection cap, for Serve
	stop    context.CancelFunc // ends every stream and waiting poll
	closers []func() error     // run in order by Close: stop the tail and retention, close the hub, then the store
}

// New opens the log c names and builds the server's handler.
func New(ctx context.Context, c Config, log *slog.Logger) (_ *Server, err error) {
	s := &Server{log: log, conf: c}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	for i, k := range c.PublishKeys {
		if k.short {
			log.Warn(fmt.Sprintf("publish key shorter than %d bytes: easy to guess; make one with openssl rand -hex 32", minKeyLen), "publish_key", i+1)
		}
	}
	subs := &subscribers{public: c.PublicTopics, log: log}
	if c.TokenKeyFile != "" {
		v, err := loadVerifier(c)
		if err != nil {
			return nil, &UsageError{fmt.Sprintf("--token-key: %v", err)}
		}
		subs.verifier = v
	}
	var stopping context.Context
	stopping, s.stop = context.WithCancel(context.Background())
	subs.stopping = stopping
	opts := replayd.Options{
		Logger:    log,
		Authorize: subs.authorize,
		SSE: replayd.SSEOptions{
			AllowedOrigins:    c.AllowOrigins,
			ReplayLimit:       c.ReplayLimit,
			HeartbeatInterval: c.Heartbeat,
			Retry:             c.Retry,
			MaxConnections:    c.MaxConnections,
			MaxTopics:         c.MaxTopics,
			DetachConnections: c.Detach,
		},
		Poll: replayd.PollOptions{MaxWait: c.PollMaxWait},
	}
	if c.ReplayLimit == 0 {
		opts.SSE.ReplayLimit = -1 // 0 means replay nothing here, not the default
	}
	if c.PollMaxWait == 0 {
		opts.Poll.MaxWait = -1
	}
	if c.Postgres != "" {
		var pgOpts []replaydpg.Option
		if c.PGPrefix != "" {
			pgOpts = append(pgOpts, replaydpg.WithTablePrefix(c.PGPrefix))
		}
		st, err := replaydpg.Open(ctx, c.Postgres, pgOpts...)
		if err != nil {
			return nil, fmt.Errorf("opening PostgreSQL: %w", err)
		}
		s.closers = append(s.closers, st.Close)
		if s.hub, err = replayd.NewWithStore(st, opts); err != nil {
			return nil, err
		}
	} else {
		db, err := replayd.OpenDB(c.DB)
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", c.DB, err)
		}
		s.closers = append(s.closers, db.Close)
		if s.hub, err = newSQLiteHub(ctx, db, opts); err != nil {
			return nil, err
		}
	}
	s.closers = append([]func() error{s.hub.Close}, s.closers...)
	if c.Postgres != "" {
		stopTail, err := s.hub.StartTail(c.TailInterval, replayd.TailOptions{})
		if err != nil {
			return nil, err
		}
		s.closers = append([]func() error{noErr(stopTail)}, s.closers...)
	}
	if policy, ok := c.retentionPolicy(); ok {
		stopRet := s.hub.StartRetention(policy, retentionInterval(policy))
		s.closers = append([]func() error{noErr(stopRet)}, s.closers...)
	}
	reg := prometheus.NewRegistry()
	if err := replaydprom.Register(reg, s.hub); err != nil {
		return nil, err
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	mux := http.NewServeMux()
	mux.Handle("/events", subs.wrap(s.hub.Handler()))
	mux.Handle("/poll", subs.wrap(s.hub.PollHandler()))
	mux.Handle("/replayd.js", scriptCORS(c.AllowOrigins, replayd.ClientScript()))
	mux.Handle("/publish", &publishHandler{hub: s.hub, keys: publishKeys(c.PublishKeys), maxBody: c.MaxBody, log: log})
	if c.StreamsPrefix != "" {
		if c.StreamsDev {
			log.Warn("--streams-dev: Durable Streams are open to every read and write, with no key or token", "prefix", c.StreamsPrefix)
		}
		mux.Handle(c.StreamsPrefix, subs.wrap(s.hub.DurableStreams(streamsOptions(c, log))))
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/readyz", s.hub.ReadyHandler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	s.handler = bodyDeadline(c.ReadTimeout, mux)
	return s, nil
}

// scriptCORS lets the pages of allowed origins import the browser module:
// a module script is fetched in CORS mode, so a page on another origin
// than the server's gets it only with Access-Control-Allow-Origin. The
// answer names the request's origin when --allow-origin lists it (Vary:
// Origin), or is * with --allow-origin *; no cookies are involved.
func scriptCORS(origins []string, next http.Handler) http.Handler {
	if len(origins) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(origins, "*") {
			w.Header().Set("Access-Control-Allow-Origin", "*")
		} else {
			w.Header().Add("Vary", "Origin")
			origin := r.Header.Get("Origin")
			for _, o := range origins {
				if origin != "" && strings.EqualFold(o, origin) {
					w.Header().Set("Access-Control-Allow-Origin", origin)
					break
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

func newSQLiteHub(ctx context.Context, db *sql.DB, opts replayd.Options) (*replayd.EventHub, error) {
	h, err := replayd.New(db, opts)
	if err != nil {
		return nil, err
	}
	if err := h.EnsureSchema(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

func noErr(f func()) func() error { return func() error { f(); return nil } }

// Handler is the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Hub is the server's hub.
func (s *Server) Hub() *replayd.EventHub { return s.hub }

// Serve serves on ln until ctx is done, then drains: it stops accepting,
// ends every stream and waiting poll (clients reconnect elsewhere), lets
// in-flight publishes finish (within DrainTimeout), and closes the log.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// No ReadTimeout or WriteTimeout: they would end every stream and long
	// poll. A request body is bounded by bodyDeadline, a stream's writes
	// by the hub's own write deadlines.
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.conf.ReadHeaderTimeout,
		IdleTimeout:       s.conf.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	ln = limitListener(ln, s.conf.MaxTCPConnections)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		s.Close()
		return err
	case <-ctx.Done():
	}
	s.log.Info("shutting down: ending streams, finishing publishes")
	s.stop()
	dctx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
	defer cancel()
	err := srv.Shutdown(dctx)
	if err != nil {
		s.log.Warn("drain timed out: closing the remaining connections", "error", err)
		srv.Close()
	}
	<-errc
	if cerr := s.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return nil // logged above; the process still exits cleanly
	}
	return err
}

// Close ends every stream, stops the hub's goroutines and closes the log.
func (s *Server) Close() error {
	if s.stop != nil {
		s.stop()
	}
	var errs []error
	for _, c := range s.closers {
		errs = append(errs, c())
	}
	s.closers = nil
	return errors.Join(errs...)
}
