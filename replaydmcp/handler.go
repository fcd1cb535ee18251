package replaydmcp

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/storage"
)

// sessionHeader is the streamable HTTP transport's session id header.
const sessionHeader = "Mcp-Session-Id"

// Handler serves MCP's streamable HTTP transport as
// [mcp.StreamableHTTPHandler] does, with the [EventStore], and also serves
// a session that another process started over the same log (a server
// before its restart, another node), which the SDK's handler answers with
// 404: its sessions live in its memory, and its client takes a 404 for the
// end of the session. Make one with [NewHandler].
//
// A request naming a session the SDK's handler does not know, that the
// event store knows as open (opened, not closed, its marker not pruned),
// is served by a session of this process for that id, adopted: made on
// first use with the server getServer returns, a state like the SDK's
// stateless sessions' (the client's initialize parameters are not known
// here), and the event store. So a client's GET with Last-Event-ID replays
// what the stream stored after it, from this process, and its next
// requests run here. A GET resuming a stream (any session's) waits up to
// 5s for data after its Last-Event-ID, so that when another process is
// still writing the stream, each of the client's reconnections brings the
// next part of it, up to the response, as it is stored. A request in flight in a process that died is lost
// with it: its tool call's response never comes, and the SDK client ends
// the call with an error once its reconnections make no progress.
//
// The SDK's handler refuses a request whose authenticated user (its
// auth.TokenInfo) is not the one that started the session; the log does
// not hold that user, so an adopted session cannot check it: behind
// authentication, check in your middleware that a session id belongs to
// the caller before Handler sees the request.
//
// Closing an adopted session in this process (Close, SessionTimeout)
// leaves the session open in the log, since its first process may still
// serve it; a DELETE from the client closes it for every process.
type Handler struct {
	sdk       *mcp.StreamableHTTPHandler
	getServer func(*http.Request) *mcp.Server
	store     *EventStore
	timeout   time.Duration

	mu      sync.Mutex
	adopted map[string]*adoptedSession
	closed  bool
}

type adoptedSession struct {
	transport *mcp.StreamableServerTransport
	session   *mcp.ServerSession
	timer     *time.Timer // nil without a SessionTimeout
}

// NewHandler returns a handler serving the servers getServer returns, with
// store as the event store. opts are the SDK handler's (nil: none); their
// EventStore is replaced by store. Close the handler when done.
func NewHandler(getServer func(*http.Request) *mcp.Server, store *EventStore, opts *mcp.StreamableHTTPOptions) *Handler {
	var o mcp.StreamableHTTPOptions
	if opts != nil {
		o = *opts
	}
	o.EventStore = store
	return &Handler{
		sdk:       mcp.NewStreamableHTTPHandler(getServer, &o),
		getServer: getServer,
		store:     store,
		timeout:   o.SessionTimeout,
		adopted:   map[string]*adoptedSession{},
	}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get(sessionHeader)
	if sid == "" {
		h.sdk.ServeHTTP(w, r)
		return
	}
	if a := h.lookup(sid); a != nil {
		h.serveAdopted(w, r, sid, a)
		return
	}
	if r.Method == http.MethodGet {
		h.awaitData(r, sid)
	}
	iw := &interceptWriter{w: w, header: http.Header{}}
	h.sdk.ServeHTTP(iw, r)
	if !iw.notFound {
		return
	}
	if iw.body.String() != "session not found\n" {
		iw.flush404() // another 404 of the SDK's: pass it on
		return
	}
	a, err := h.adopt(r, sid)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if a == nil {
		http.Error(w, "session not found", http.StatusNotFound) // as the SDK's handler
		return
	}
	h.serveAdopted(w, r, sid, a)
}

func (h *Handler) lookup(sid string) *adoptedSession {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.adopted[sid]
}

// adopt returns the adopted session for sid, made if the event store
// knows the session as open; nil if it does not.
func (h *Handler) adopt(r *http.Request, sid string) (*adoptedSession, error) {
	live, err := h.store.sessionOpen(r.Context(), sid)
	if err != nil || !live {
		return nil, err
	}
	server := h.getServer(r)
	if server == nil {
		return nil, fmt.Errorf("replaydmcp: no server for session %q", sid)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, fmt.Errorf("replaydmcp: handler closed")
	}
	if a := h.adopted[sid]; a != nil {
		return a, nil
	}
	version := r.Header.Get("Mcp-Protocol-Version")
	if version == "" {
		version = "2025-06-18"
	}
	t := &mcp.StreamableServerTransport{SessionID: sid, EventStore: adoptedStore{h.store}}
	ss, err := server.Connect(context.WithoutCancel(r.Context()), t, &mcp.ServerSessionOptions{State: &mcp.ServerSessionState{
		InitializeParams:  &mcp.InitializeParams{ProtocolVersion: version},
		InitializedParams: &mcp.InitializedParams{},
		LogLevel:          "info",
	}})
	if err != nil {
		return nil, fmt.Errorf("replaydmcp: adopt session %q: %w", sid, err)
	}
	a := &adoptedSession{transport: t, session: ss}
	if h.timeout > 0 {
		a.timer = time.AfterFunc(h.timeout, func() { h.drop(sid, a) })
	}
	h.adopted[sid] = a
	return a, nil
}

// drop closes an adopted session in this process only.
func (h *Handler) drop(sid string, a *adoptedSession) {
	h.mu.Lock()
	if h.adopted[sid] == a {
		delete(h.adopted, sid)
	}
	h.mu.Unlock()
	a.session.Close()
}

func (h *Handler) serveAdopted(w http.ResponseWriter, r *http.Request, sid string, a *adoptedSession) {
	if a.timer != nil {
		a.timer.Reset(h.timeout)
	}
	switch r.Method {
	case http.MethodGet:
		h.awaitData(r, sid)
		a.transport.ServeHTTP(w, r)
	case http.MethodPost:
		a.transport.ServeHTTP(w, r)
	case http.MethodDelete:
		h.drop(sid, a)
		if err := h.store.SessionClosed(r.Context(), sid); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	}
}

// resumeWait bounds how long a GET resuming a stream waits for data after
// its Last-Event-ID.
const resumeWait = 5 * time.Second

// awaitData holds a GET resuming a stream until the log has data of the
// stream after its Last-Event-ID, for at most resumeWait. The stream may
// be another process's (its request runs there, appending as it goes: the
// client came from there, or went there and back), and the SDK's
// transport, for a stream it does not run, replays what the log holds and
// ends the response: an empty replay would end the client's call
// ("request terminated without response"), where waiting lets each
// reconnection bring the next data, up to the response. For a stream this
// process runs, waiting loses nothing: what it sends meanwhile is stored,
// and replayed when the wait ends. It waits on the log's notifications when the store has them
// (storage.Notifier: PostgreSQL), else polls.
func (h *Handler) awaitData(r *http.Request, sid string) {
	streamID, idx, ok := strings.Cut(r.Header.Get("Last-Event-ID"), "_")
	index, err := strconv.Atoi(idx)
	if !ok || err != nil || strings.Contains(idx, "_") {
		return // none, or malformed: the SDK's transport answers it
	}
	ctx, cancel := context.WithTimeout(r.Context(), resumeWait)
	defer cancel()
	topic := streamTopic(sid, streamID)
	notifier, _ := h.store.st.(storage.Notifier)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		head, err := h.store.st.Head(ctx)
		if err != nil {
			return
		}
		if next, err := h.store.nextIndex(ctx, topic); err != nil || next > index+1 {
			return // data to replay, or an error After will report
		}
		if notifier != nil {
			if notifier.WaitForAppend(ctx, head) != nil {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Close closes the sessions this handler adopted, in this process only
// (see [Handler]). The SDK handler's own sessions end as the SDK ends
// them.
func (h *Handler) Close() error {
	h.mu.Lock()
	h.closed = true
	adopted := h.adopted
	h.adopted = map[string]*adoptedSession{}
	h.mu.Unlock()
	for _, a := range adopted {
		if a.timer != nil {
			a.timer.Stop()
		}
		a.session.Close()
	}
	return nil
}

// adoptedStore is the event store of an adopted session: closing the
// session in this process does not close it in the log.
type adoptedStore struct{ *EventStore }

func (adoptedStore) SessionClosed(context.Context, string) error { return nil }

// sessionOpen reports whether the log holds the session's marker and no
// record of its close.
func (s *EventStore) sessionOpen(ctx context.Context, sessionID string) (bool, error) {
	stt := sessionTopic(sessionID)
	req := storage.ReadRequest{Scope: []string{stt}, Limit: 16}
	open := false
	for {
		page, err := s.st.Read(ctx, req)
		if err != nil {
			return false, fmt.Errorf("replaydmcp: %w", err)
		}
		for _, ev := range page.Events {
			switch {
			case ev.Topic != stt:
			case ev.Type == typeSessionOpen:
				open = true
			case ev.Type == typeSessionClosed:
				return false, nil
			}
			req.After = ev.Sequence
		}
		if !page.More {
			return open, nil
		}
	}
}

// interceptWriter passes a response through, except the SDK handler's 404
// for a session it does not know, which it swallows (notFound), so that
// the request can be served again by an adopted session.
type interceptWriter struct {
	w        http.ResponseWriter
	header   http.Header
	wrote    bool
	notFound bool
	body     bytes.Buffer // of the 404, up to 1 KiB
}

// flush404 writes the swallowed 404 as it was.
func (iw *interceptWriter) flush404() {
	for k, v := range iw.header {
		iw.w.Header()[k] = v
	}
	iw.w.WriteHeader(http.StatusNotFound)
	iw.w.Write(iw.body.Bytes())
}

func (iw *interceptWriter) Header() http.Header {
	if iw.wrote && !iw.notFound {
		return iw.w.Header()
	}
	return iw.header
}

func (iw *interceptWriter) WriteHeader(code int) {
	if iw.wrote {
		return
	}
	iw.wrote = true
	if code == http.StatusNotFound {
		iw.notFound = true
		return
	}
	for k, v := range iw.header {
		iw.w.Header()[k] = v
	}
	iw.w.WriteHeader(code)
}

func (iw *interceptWriter) Write(b []byte) (int, error) {
	if !iw.wrote {
		iw.WriteHeader(http.StatusOK)
	}
	if iw.notFound {
		if iw.body.Len() < 1024 {
			iw.body.Write(b)
		}
		return len(b), nil
	}
	return iw.w.Write(b)
}

// Flush and Unwrap let the SDK flush its event stream through
// http.NewResponseController.
func (iw *interceptWriter) Flush() {
	if !iw.wrote {
		iw.WriteHeader(http.StatusOK)
	}
	if !iw.notFound {
		http.NewResponseController(iw.w).Flush()
	}
}

func (iw *interceptWriter) Unwrap() http.ResponseWriter { return iw.w }
