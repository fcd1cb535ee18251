package jobs

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// The stream-relay wire protocol, version 2 (shared/seeds/stream-relay.md):
//
//	POST {prefix}streams     {streamId?, payload?}
//	  -> {protocolVersion: 2, streamId, startedAt}
//	GET  {prefix}streams/{id}?since=N&eventSince=M
//	  -> {protocolVersion: 2, streamId, status, complete, completed_at?,
//	      progress?, append, nextOffset, events, nextEventOffset,
//	      lastEventAt, serverNow, final?: {text, events?, meta?}, error?,
//	      errorInfo?: {code, message}}
//
// since and nextOffset are UTF-16 code units; eventSince and
// nextEventOffset count events. A stream that does not exist (never
// started, or deleted after its retention) is answered 200 with status
// not_found, as the document has it a status like the others.

// RelayConfig configures the wire protocol's handler.
type RelayConfig struct {
	// Prefix is where the handler is mounted (its routes are Prefix +
	// "streams" and Prefix + "streams/{id}"); default "/".
	Prefix string
	// Upstream makes the job a POST starts from its payload (a JSON
	// value, nil when the body has none). Required.
	Upstream func(r *http.Request, payload json.RawMessage) Func
	// Authorize decides each request (method "POST" or "GET", the stream
	// id; "" for a POST that names none): a non-nil error refuses it, 401
	// when Unauthenticated(err), else 403.
	Authorize       func(r *http.Request, method, streamID string) error
	Unauthenticated func(error) bool
	MaxBody         int64 // a POST's body; default 1 MiB
}

// Relay returns the wire protocol's handler over m.
func (m *Manager) Relay(cfg RelayConfig) http.Handler {
	if cfg.Prefix == "" {
		cfg.Prefix = "/"
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	return &relay{m: m, cfg: cfg}
}

type relay struct {
	m   *Manager
	cfg RelayConfig
}

// relayError answers an error the protocol leaves open: a JSON body.
func relayError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"protocolVersion": 2, "error": msg})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(v)
}

func (rl *relay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, rl.cfg.Prefix+"streams")
	if !ok {
		http.NotFound(w, r)
		return
	}
	switch {
	case rest == "" || rest == "/":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			relayError(w, http.StatusMethodNotAllowed, "POST starts a stream")
			return
		}
		rl.start(w, r)
	case strings.HasPrefix(rest, "/"):
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			relayError(w, http.StatusMethodNotAllowed, "GET polls a stream")
			return
		}
		id := rest[1:]
		if raw := r.URL.RawPath; raw != "" {
			// the id as sent, unescaped once (an id may hold a "/")
			if i := strings.Index(raw, rl.cfg.Prefix+"streams/"); i >= 0 {
				if u, err := url.PathUnescape(raw[i+len(rl.cfg.Prefix+"streams/"):]); err == nil {
					id = u
				}
			}
		}
		rl.poll(w, r, id)
	default:
		http.NotFound(w, r)
	}
}

func (rl *relay) authorize(w http.ResponseWriter, r *http.Request, method, id string) bool {
	if rl.cfg.Authorize == nil {
		return true
	}
	err := rl.cfg.Authorize(r, method, id)
	if err == nil {
		return true
	}
	if rl.cfg.Unauthenticated != nil && rl.cfg.Unauthenticated(err) {
		relayError(w, http.StatusUnauthorized, err.Error())
	} else {
		relayError(w, http.StatusForbidden, err.Error())
	}
	return false
}

func (rl *relay) start(w http.ResponseWriter, r *http.Request) {
	var body struct {
		StreamID *string         `json:"streamId"`
		Payload  json.RawMessage `json:"payload"`
	}
	r.Body = http.MaxBytesReader(w, r.Body, rl.cfg.MaxBody)
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(&body); err != nil && !errors.Is(err, io.EOF) {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			relayError(w, http.StatusRequestEntityTooLarge, "the body is too large")
			return
		}
		relayError(w, http.StatusBadRequest, "the body is not a JSON object {streamId?, payload?}")
		return
	}
	id := ""
	if body.StreamID != nil {
		id = *body.StreamID
		if !validID(id) {
			relayError(w, http.StatusBadRequest, ErrBadID.Error())
			return
		}
	}
	if !rl.authorize(w, r, http.MethodPost, id) {
		return
	}
	if string(body.Payload) == "null" {
		body.Payload = nil
	}
	if rl.cfg.Upstream == nil {
		relayError(w, http.StatusNotImplemented, "this relay starts no jobs (no Upstream)")
		return
	}
	fn := rl.cfg.Upstream(r, body.Payload)
	info, _, err := rl.m.Start(r.Context(), id, fn)
	if err != nil {
		if r.Context().Err() == nil {
			rl.m.cfg.Logger.Error("replayd: jobs: start", "err", err)
			relayError(w, http.StatusServiceUnavailable, "the job could not be started")
		}
		return
	}
	writeJSON(w, map[string]any{"protocolVersion": 2, "streamId": info.ID, "startedAt": info.Created.UnixMilli()})
}

// pollAnswer is a GET's answer, every field of the document.
type pollAnswer struct {
	ProtocolVersion int               `json:"protocolVersion"`
	StreamID        string            `json:"streamId"`
	Status          string            `json:"status"`
	Complete        bool              `json:"complete"`
	CompletedAt     *int64            `json:"completed_at,omitempty"`
	Progress        json.RawMessage   `json:"progress,omitempty"`
	Append          string            `json:"append"`
	NextOffset      int64             `json:"nextOffset"`
	Events          []json.RawMessage `json:"events"`
	NextEventOffset int64             `json:"nextEventOffset"`
	LastEventAt     int64             `json:"lastEventAt"`
	ServerNow       int64             `json:"serverNow"`
	Final           *finalAnswer      `json:"final,omitempty"`
	Error           string            `json:"error,omitempty"`
	ErrorInfo       *ErrorInfo        `json:"errorInfo,omitempty"`
}

type finalAnswer struct {
	Text   string            `json:"text"`
	Events []json.RawMessage `json:"events,omitempty"`
	Meta   json.RawMessage   `json:"meta,omitempty"`
}

func (rl *relay) poll(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	since, ok1 := offsetParam(q.Get("since"))
	eventSince, ok2 := offsetParam(q.Get("eventSince"))
	if !ok1 || !ok2 {
		relayError(w, http.StatusBadRequest, "since and eventSince are non-negative integers")
		return
	}
	if !rl.authorize(w, r, http.MethodGet, id) {
		return
	}
	p, err := rl.m.Read(r.Context(), id, since, eventSince, true)
	now := rl.m.cfg.Now().UnixMilli()
	if errors.Is(err, ErrNotFound) {
		writeJSON(w, pollAnswer{ProtocolVersion: 2, StreamID: id, Status: "not_found", NextOffset: since,
			Events: []json.RawMessage{}, NextEventOffset: eventSince, ServerNow: now})
		return
	}
	if err != nil {
		if r.Context().Err() == nil {
			rl.m.cfg.Logger.Error("replayd: jobs: poll", "job", id, "err", err)
			relayError(w, http.StatusServiceUnavailable, "the job could not be read")
		}
		return
	}
	a := pollAnswer{ProtocolVersion: 2, StreamID: p.ID, Status: string(p.Status), Complete: p.Status == Complete,
		Progress: p.Progress, Append: p.Append, NextOffset: p.NextOffset, Events: p.Events,
		NextEventOffset: p.NextEventOffset, LastEventAt: p.Updated.UnixMilli(), ServerNow: now}
	if p.Status == Complete {
		c := p.Completed.UnixMilli()
		a.CompletedAt = &c
		a.Final = &finalAnswer{Text: *p.Text, Events: p.AllEvents, Meta: p.Meta}
	}
	if p.Err != nil {
		a.Error, a.ErrorInfo = p.Err.Message, p.Err
	}
	writeJSON(w, a)
}

// offsetParam parses since / eventSince: absent is 0.
func offsetParam(s string) (int64, bool) {
	if s == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}
