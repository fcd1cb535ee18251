package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/storage"
)

// Config is what a Handler needs from its hub.
type Config struct {
	Store storage.StreamStore
	// Live wakes long polls and SSE streams on appends to their topic,
	// from any process or node.
	Live *live.Hub
	// Deliver delivers events a stream transaction committed to the hub's
	// live subscribers.
	Deliver func([]storage.Event)
	// Prefix is the path the handler is mounted at ("/v1/stream/");
	// TopicPrefix is put before a stream's name to make its topic.
	Prefix, TopicPrefix string
	// DataType is the event type of a stream's data events.
	DataType string
	// AuthorizeRead and AuthorizeWrite decide a request for a topic; an
	// error wrapping Unauthenticated answers 401, any other 403.
	AuthorizeRead, AuthorizeWrite func(r *http.Request, topic string) error
	Unauthenticated               error
	// AllowOrigin applies the hub's origin policy, setting the CORS
	// headers of an allowed cross-origin request; false: refused.
	AllowOrigin func(w http.ResponseWriter, r *http.Request) bool
	// AcquireSlot takes a connection slot for a waiting long poll or an
	// open SSE stream (the hub's MaxConnections).
	AcquireSlot func() (release func(), ok bool)
	Done        <-chan struct{} // closed when the hub closes
	Logger      *slog.Logger
	// MaxWait is the longest a long poll is held; SSEFor how long an SSE
	// response stays open before the client is asked to reconnect.
	MaxWait, SSEFor time.Duration
	// MaxBody bounds a request body.
	MaxBody int64
	// Prune deletes a topic's events through a sequence, for the sweep
	// (sweep.go); nil: they are left to retention.
	Prune func(ctx context.Context, topic string, through int64) (int64, error)
	// Reading is told of a read of topic (a catch-up read, a long poll, an
	// SSE stream) that found the stream; done, if not nil, is called when
	// the read ends. Nil: nobody is told.
	Reading func(topic string) (done func())
	Now     func() time.Time
}

// Handler serves the protocol. Build it with New.
type Handler struct {
	Config
	prefix, topicPrefix string
}

// New returns a Handler for cfg.
func New(cfg Config) *Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 30 * time.Second
	}
	if cfg.SSEFor <= 0 {
		cfg.SSEFor = 60 * time.Second
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 8 << 20
	}
	if cfg.DataType == "" {
		cfg.DataType = "message"
	}
	if cfg.AcquireSlot == nil {
		cfg.AcquireSlot = func() (func(), bool) { return func() {}, true }
	}
	prefix := cfg.Prefix
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Handler{Config: cfg, prefix: prefix, topicPrefix: cfg.TopicPrefix}
}

// The protocol's headers.
const (
	hNextOffset     = "Stream-Next-Offset"
	hUpToDate       = "Stream-Up-To-Date"
	hCursor         = "Stream-Cursor"
	hClosed         = "Stream-Closed"
	hSeq            = "Stream-Seq"
	hTTL            = "Stream-TTL"
	hExpiresAt      = "Stream-Expires-At"
	hSSEEncoding    = "Stream-SSE-Data-Encoding"
	hForkedFrom     = "Stream-Forked-From"
	hForkOffset     = "Stream-Fork-Offset"
	hForkSubOffset  = "Stream-Fork-Sub-Offset"
	hProducerID     = "Producer-Id"
	hProducerEpoch  = "Producer-Epoch"
	hProducerSeq    = "Producer-Seq"
	hExpectedSeq    = "Producer-Expected-Seq"
	hReceivedSeq    = "Producer-Received-Seq"
	allowHeaders    = "Content-Type, Authorization, If-None-Match, Stream-Seq, Stream-TTL, Stream-Expires-At, Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset"
	exposeHeaders   = "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At, Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Content-Type, Location"
	allowMethods    = "GET, POST, PUT, DELETE, HEAD, OPTIONS"
	textPlain       = "text/plain; charset=utf-8"
	defaultDataType = "application/octet-stream"
)

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// Browser security headers on every answer (the protocol's §10.7).
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cross-Origin-Resource-Policy", "cross-origin")
	if h.AllowOrigin != nil && !h.AllowOrigin(w, r) {
		httpError(w, http.StatusForbidden, "origin not allowed")
		return
	}
	hd.Set("Access-Control-Expose-Headers", exposeHeaders)
	if r.Method == http.MethodOptions {
		hd.Set("Access-Control-Allow-Methods", allowMethods)
		hd.Set("Access-Control-Allow-Headers", allowHeaders)
		hd.Set("Allow", allowMethods)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	topic, err := h.topicOf(r)
	if err != nil {
		httpError(w, http.StatusBadRequest, "invalid stream path")
		return
	}
	if _, err := parseQuery(r.URL.RawQuery); err != nil {
		httpError(w, http.StatusBadRequest, "invalid query string")
		return
	}
	write := r.Method != http.MethodGet && r.Method != http.MethodHead
	if !h.authorize(w, r, topic, write) {
		return
	}
	switch r.Method {
	case http.MethodPut:
		h.create(w, r, topic)
	case http.MethodPost:
		h.append(w, r, topic)
	case http.MethodGet:
		h.read(w, r, topic)
	case http.MethodHead:
		h.head(w, r, topic)
	case http.MethodDelete:
		h.delete(w, r, topic)
	default:
		hd.Set("Allow", allowMethods)
		httpError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// authorize runs the read or write check; false: refused and answered.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, topic string, write bool) bool {
	check := h.AuthorizeRead
	if write {
		check = h.AuthorizeWrite
	}
	if check == nil {
		return true
	}
	err := check(r, topic)
	if err == nil {
		return true
	}
	h.Logger.Debug("replayd: durable streams: refused", "topic", topic, "write", write, "err", err)
	if h.Unauthenticated != nil && errors.Is(err, h.Unauthenticated) {
		httpError(w, http.StatusUnauthorized, "unauthenticated")
	} else {
		httpError(w, http.StatusForbidden, "forbidden")
	}
	return false
}

// httpError answers status with a plain-text message.
func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", textPlain)
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

// goneError answers 410 for an offset that is not a position of the
// stream, with a JSON body naming why (code: unknown_offset, retention).
func goneError(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusGone)
	fmt.Fprintf(w, "{\"error\":%q,\"code\":%q}\n", msg, code)
}

// serverError answers 503 for a failure of the store (logged), or 503 as
// the hub closes.
func (h *Handler) serverError(w http.ResponseWriter, r *http.Request, topic string, err error) {
	h.Logger.Error("replayd: durable streams: store", "method", r.Method, "topic", topic, "err", err)
	httpError(w, http.StatusServiceUnavailable, "the log is unavailable, retry later")
}
