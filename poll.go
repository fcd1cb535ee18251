package replayd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/replayd/replayd/storage"

	"github.com/replayd/replayd/internal/live"
)

// PollHandler returns the poll endpoint: the log, cursors and gaps of the
// SSE endpoint as plain JSON, for clients that cannot hold a stream open.
// Mount it beside the SSE endpoint:
//
//	mux.Handle("/poll", hub.PollHandler())
//
// GET /poll?topic=a&cursor=17&limit=100&wait=25 answers the oldest events of
// the scope above the cursor, at most limit of them, with the cursor to send
// next; with wait > 0 a request that has nothing to answer is held until an
// event of its scope is committed, for at most wait seconds
// (PollOptions.MaxWait). An answer is cut once its events hold 4 MiB of
// payload (PollOptions), and a poll the log cannot answer gets 503 with
// Retry-After and {"error":…}. PROTOCOL.md describes the request and the
// answer.
//
// Polls near the head are answered from memory. The hub keeps the newest
// rows it delivered live (16,384 of them, fewer once they hold 4 MiB of
// payload), a contiguous run: every row of the log in its range, whoever
// wrote it. A poll whose cursor is one of them (or the head) is answered
// from that run after one small read of the log's head and prune
// watermark, shared by every poll that arrived before it started (such
// reads start at most every 500 µs, so under load a poll may wait that
// long for one). The answer is then the one a log read at that moment
// gives, byte for byte. The log is read as before when the run does not
// reach the head (other processes appended, and no tail or publish of this
// hub has brought their rows yet), when rows above the cursor were pruned,
// for a cursor below the run, between its rows or above the head (such a
// cursor may be foreign: unknown_cursor), and after a gap or a reset of
// the log, which empty the run.
func (h *EventHub) PollHandler() http.Handler { return (*pollHandler)(h) }

type pollHandler EventHub

// pollAnswer is a poll's JSON answer.
type pollAnswer struct {
	Topics []string    `json:"topics"`
	Cursor int64       `json:"cursor"`
	Head   int64       `json:"head"`
	More   bool        `json:"more"`
	Gap    *wireGap    `json:"gap"`
	Events []pollEvent `json:"events"`
}

type pollEvent struct {
	ID    int64           `json:"id"`
	Type  string          `json:"type"`
	Topic *string         `json:"topic"` // null for a broadcast
	Data  json.RawMessage `json:"data"`
	asIs  bool            // Data is valid JSON that encodes as it is (encodesAsIs)
}

func (ph *pollHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := (*EventHub)(ph)
	switch r.Method {
	case http.MethodGet:
	case http.MethodOptions:
		h.preflight(w, r, "GET, OPTIONS")
		return
	default:
		w.Header().Set("Allow", "GET, OPTIONS")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	// A cross-origin page's script must be able to read Retry-After (503).
	w.Header().Set("Access-Control-Expose-Headers", "Retry-After")
	query, topics, release, ok := h.admit(w, r, transportPoll)
	if !ok {
		return
	}
	defer release()
	if done := h.reading(topics); done != nil {
		defer done() // a long poll reads for as long as it waits
	}
	p, err := parsePollParams(query, h.opts.Poll.MaxLimit, h.opts.Poll.MaxWait)
	if err != nil {
		h.metrics.refused(refusedBadRequest)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ans, status, err := h.longPoll(r.Context(), w, r, topics, p)
	switch {
	case err != nil:
		h.pollUnavailable(w, err)
		return
	case status == 0:
		return // answered already (overload), or the client left
	}
	if ans.Topics == nil {
		ans.Topics = []string{}
	}
	if ans.Gap != nil {
		h.metrics.gap(ans.Gap.Reason)
	}
	h.metrics.replayed(transportPoll, len(ans.Events))
	h.writePollAnswer(w, status, &ans, topics)
}

// pollPageBytes is the payload, in bytes, at which a poll answer is cut:
// no further event once its events hold this many (PollOptions' doc).
// With payloads of at most 1 MiB, an answer holds less than 5 MiB of them.
const pollPageBytes = 4 << 20

// pollFlushBytes is how much of an answer is encoded before it is written:
// an answer that fits is written whole, with a Content-Length; a larger one
// passes through a buffer of about this size, its status sent first.
const pollFlushBytes = 32 << 10

// writePollAnswer encodes ans and writes it with status. An answer larger
// than pollFlushBytes is streamed: its payloads are checked before the
// status is sent, so that a stored payload encoding/json would refuse
// still gets a 500 rather than half an answer.
func (h *EventHub) writePollAnswer(w http.ResponseWriter, status int, ans *pollAnswer, topics []string) {
	buf := pollBuffers.Get().(*[]byte)
	defer putPollBuffer(buf)
	e := pollEncoder{buf: (*buf)[:0], flushAt: pollFlushBytes}
	defer func() { *buf = e.buf }()
	writeHeader := func() {
		hdr := w.Header()
		hdr.Set("Content-Type", "application/json")
		hdr.Set("Cache-Control", "no-store")
		w.WriteHeader(status)
	}
	e.head(ans)
	for i := range ans.Events {
		ev := &ans.Events[i]
		if e.out == nil && len(e.buf)+len(ev.Data) > e.flushAt {
			if err := checkPayloads(ans.Events[i:]); err != nil {
				h.logger.Error("replayd: encode a poll answer", "topics", topics, "err", err)
				http.Error(w, "internal error", http.StatusInternalServerError)
				return
			}
			writeHeader()
			e.out = w
		}
		if err := e.event(ev); err != nil {
			h.logger.Error("replayd: encode a poll answer", "topics", topics, "err", err)
			if e.out == nil {
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
			return // checked: not reached once the status is sent
		}
		if e.err != nil {
			return // the client went away
		}
	}
	e.tail(ans)
	if e.out == nil {
		writeHeader()
		w.Write(e.buf)
		return
	}
	e.flush()
}

// pollUnavailable answers a poll the log could not answer: 503,
// Retry-After, and an error body that no client can take for an answer.
func (h *EventHub) pollUnavailable(w http.ResponseWriter, err error) {
	msg := "the event log cannot be read, retry later"
	if errors.Is(err, ErrClosed) {
		msg = "server is shutting down, retry later"
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("Retry-After", strconv.FormatInt((h.overloadDelay()+999)/1000, 10))
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write(appendJSONString(append([]byte(nil), `{"error":`...), msg))
	w.Write([]byte("}"))
}

// pollBuffers holds the buffers poll answers are encoded into; a buffer
// grown past maxPooledPollBuffer is dropped rather than kept.
var pollBuffers = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledPollBuffer = 64 << 10

func putPollBuffer(buf *[]byte) {
	if cap(*buf) <= maxPooledPollBuffer {
		pollBuffers.Put(buf)
	}
}

// appendJSON appends the answer exactly as encoding/json.Marshal encodes
// it (FuzzPollAnswerJSON holds the two to the same bytes).
func (a *pollAnswer) appendJSON(b []byte) ([]byte, error) {
	e := pollEncoder{buf: b}
	e.head(a)
	for i := range a.Events {
		if err := e.event(&a.Events[i]); err != nil {
			return e.buf, err
		}
	}
	e.tail(a)
	return e.buf, nil
}

// pollEncoder encodes a poll answer exactly as encoding/json.Marshal does,
// without reflection, into buf; the gap, rare, and any string that needs
// escaping are still encoded by encoding/json. Once out is set, buf is
// written to out whenever it holds flushAt bytes, and a payload's runs of
// flushAt bytes or more go to out straight from the payload: an answer of
// any size passes through a buffer of about flushAt bytes.
type pollEncoder struct {
	buf     []byte
	out     io.Writer
	flushAt int
	err     error // the first error writing to out; later writes are dropped
	events  int   // events encoded so far
}

// head encodes everything before the events' first.
func (e *pollEncoder) head(a *pollAnswer) {
	b := append(e.buf, `{"topics":`...)
	if a.Topics == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, t := range a.Topics {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, t)
		}
		b = append(b, ']')
	}
	b = append(b, `,"cursor":`...)
	b = strconv.AppendInt(b, a.Cursor, 10)
	b = append(b, `,"head":`...)
	b = strconv.AppendInt(b, a.Head, 10)
	b = append(b, `,"more":`...)
	b = strconv.AppendBool(b, a.More)
	b = append(b, `,"gap":`...)
	if a.Gap == nil {
		b = append(b, "null"...)
	} else {
		enc, _ := json.Marshal(a.Gap) // ints, a reason and nulls: always encodes
		b = append(b, enc...)
	}
	b = append(b, `,"events":`...)
	if a.Events == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
	}
	e.buf = b
}

// event encodes one event, after a comma unless it is the first.
func (e *pollEncoder) event(ev *pollEvent) error {
	b := e.buf
	if e.events++; e.events > 1 {
		b = append(b, ',')
	}
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, ev.ID, 10)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, ev.Type)
	b = append(b, `,"topic":`...)
	if ev.Topic == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, *ev.Topic)
	}
	e.buf = append(b, `,"data":`...)
	if ev.asIs {
		e.write(ev.Data)
	} else if err := e.raw(ev.Data); err != nil {
		return err
	}
	e.buf = append(e.buf, '}')
	e.write(nil)
	return nil
}

// tail encodes everything after the events' last.
func (e *pollEncoder) tail(a *pollAnswer) {
	if a.Events != nil {
		e.buf = append(e.buf, ']')
	}
	e.buf = append(e.buf, '}')
}

// write appends p to the answer (see pollEncoder).
func (e *pollEncoder) write(p []byte) {
	if e.out == nil || len(e.buf)+len(p) < e.flushAt {
		e.buf = append(e.buf, p...)
		return
	}
	e.flush()
	if len(p) < e.flushAt {
		e.buf = append(e.buf, p...)
	} else if e.err == nil {
		_, e.err = e.out.Write(p)
	}
}

// flush writes what buf holds to out.
func (e *pollEncoder) flush() {
	if len(e.buf) > 0 && e.err == nil {
		_, e.err = e.out.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

// raw encodes a payload as encoding/json.Marshal encodes a
// json.RawMessage: nil as null; compacted, with <, >, &, U+2028 and U+2029
// escaped; an error if it is not valid JSON. It copies the payload's runs
// between those as they are: a payload as Publish usually stores it (no
// white space between tokens, none of those characters) in one piece.
func (e *pollEncoder) raw(raw []byte) error {
	if raw == nil {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	if !validJSON(raw) {
		return errInvalidPayload
	}
	const hex = "0123456789abcdef"
	start, inString := 0, false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			inString = !inString
		case c == '\\':
			i++ // valid JSON: a backslash is in a string, before one more byte
		case c == '<' || c == '>' || c == '&':
			e.write(raw[start:i])
			e.buf = append(e.buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			start = i + 1
		case c == 0xE2 && i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xA8: // U+2028, U+2029
			e.write(raw[start:i])
			e.buf = append(e.buf, '\\', 'u', '2', '0', '2', hex[raw[i+2]&0xF])
			i += 2
			start = i + 1
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			e.write(raw[start:i])
			start = i + 1
		}
	}
	e.write(raw[start:])
	return nil
}

// errInvalidPayload is the error of a stored payload that is not valid
// JSON (encoding/json.Marshal refuses it too).
var errInvalidPayload = errors.New("a stored payload is not valid JSON")

// checkPayloads returns errInvalidPayload if pollEncoder.raw would refuse
// one of evs' payloads.
func checkPayloads(evs []pollEvent) error {
	for i := range evs {
		if !evs[i].asIs && evs[i].Data != nil && !validJSON(evs[i].Data) {
			return fmt.Errorf("event %d: %w", evs[i].ID, errInvalidPayload)
		}
	}
	return nil
}

// longPoll builds the answer to one poll request, holding a long poll until an
// event of its scope is committed above its cursor, wait runs out, its
// access is revoked (WithRevocation), the client leaves or the hub closes.
// A status of 0 means the answer, if any, was written already; an error,
// that the log could not be read (or the hub is closing).
func (h *EventHub) longPoll(ctx context.Context, w http.ResponseWriter, r *http.Request, topics []string, p pollParams) (pollAnswer, int, error) {
	ans := pollAnswer{Topics: topics, Events: []pollEvent{}}
	var waiter *live.Waiter
	if p.wait > 0 {
		// Registered before the log is read: an event committed after the
		// read wakes the wait; one committed before is in the read.
		waiter = live.NewWaiter(topics)
		h.live.AddWaiter(waiter)
		defer h.live.RemoveWaiter(waiter)
	}
	var (
		deadline   *time.Timer
		releaseCap func()
		revoked    <-chan struct{} // closed once the request's access is revoked (WithRevocation)
		unrevoke   func()
	)
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
		if unrevoke != nil {
			unrevoke()
		}
		if releaseCap != nil {
			releaseCap()
			h.metrics.connClosed(transportPoll)
		}
	}()
	cursor, fresh := p.cursor, p.fresh
	for {
		// A revocation is checked before each read and after it, before
		// anything read is answered: its watch runs elsewhere, and only
		// once the poll waits.
		if isRevoked(ctx) {
			return h.revokedPoll(w, ans, releaseCap != nil)
		}
		pg, asIs, err := h.readPoll(ctx, topics, cursor, fresh, p.limit)
		if isRevoked(ctx) {
			return h.revokedPoll(w, ans, releaseCap != nil)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ans, 0, nil
			}
			if err != ErrClosed {
				h.logger.Error("replayd: read the log for a poll", "topics", topics, "remote", r.RemoteAddr, "err", err)
			}
			return ans, 0, err
		}
		ans.Head = pg.Head
		if fresh {
			cursor, fresh = pg.Head, false // held from the head, like any long poll
		}
		ans.Cursor = cursor
		switch {
		case cursor > pg.Head || pg.Foreign:
			ans.Gap = &wireGap{Reason: reasonUnknownCursor, ResumedFrom: ptr(cursor), ReplayLimit: p.limit}
			ans.Cursor = pg.Head
			return ans, http.StatusOK, nil
		case pg.Watermark > cursor:
			ans.Gap = &wireGap{
				Reason:        reasonPruned,
				ResumedFrom:   ptr(cursor),
				MissedFrom:    ptr(cursor + 1),
				MissedThrough: ptr(pg.Watermark),
				ReplayLimit:   p.limit,
			}
		}
		if len(pg.Events) > 0 || ans.Gap != nil || waiter == nil {
			ans.Events = make([]pollEvent, 0, len(pg.Events))
			for i := range pg.Events {
				ev := &pg.Events[i]
				pe := pollEvent{ID: ev.Sequence, Type: ev.Type, Data: ev.Payload, asIs: asIs != nil && asIs[i]}
				if ev.Topic != "" {
					pe.Topic = &ev.Topic
				}
				ans.Events = append(ans.Events, pe)
			}
			if n := len(pg.Events); n > 0 {
				ans.Cursor = pg.Events[n-1].Sequence
			} else if ans.Gap != nil {
				// A pruned gap with no event after it: the cursor moves
				// past the range it names, which holds nothing more for
				// the scope, so the next poll is held rather than answered
				// the same gap again at once.
				ans.Cursor = pg.Watermark
			}
			ans.More = pg.More
			return ans, http.StatusOK, nil
		}
		// Nothing to answer yet: wait, holding a connection slot.
		if releaseCap == nil {
			var ok bool
			if releaseCap, ok = h.acquireSlot(); !ok {
				h.overloaded(w, r, transportPoll)
				return ans, 0, nil
			}
			h.metrics.connOpened(transportPoll)
			deadline = time.NewTimer(p.wait)
			revoked, unrevoke = revokedChan(ctx)
		}
		select {
		case <-waiter.Woken():
			h.live.AddWaiter(waiter) // before the next read, as above
		case <-deadline.C:
			return ans, http.StatusOK, nil
		case <-revoked:
			// Answered as if the wait ran out: the client polls again,
			// and Authorize decides again.
			return ans, http.StatusOK, nil
		case <-h.done:
			return ans, http.StatusOK, nil
		case <-ctx.Done():
			return ans, 0, nil
		}
	}
}

// revokedPoll answers a poll whose access was revoked (WithRevocation)
// before its answer was built. One that waited is answered as if its wait
// had run out: ans, with no events, holds what its last read answered
// before the wait. One revoked before it waited is refused with 403, as by
// Authorize; nothing it read is answered.
func (h *EventHub) revokedPoll(w http.ResponseWriter, ans pollAnswer, waited bool) (pollAnswer, int, error) {
	if waited {
		return ans, http.StatusOK, nil
	}
	h.metrics.refused(refusedForbidden)
	http.Error(w, "access revoked", http.StatusForbidden)
	return ans, 0, nil
}

// readPoll reads a poll's page under a read slot: for a fresh request only
// the head counts, and nothing above it is returned.
func (h *EventHub) readPoll(ctx context.Context, topics []string, cursor int64, fresh bool, limit int) (storage.Page, []bool, error) {
	if pg, asIs, ok := h.live.AnswerPoll(ctx, storage.ReadRequest{Scope: topics, After: cursor, Limit: limit, MaxBytes: pollPageBytes}, fresh); ok {
		h.metrics.pollMemory.Add(1)
		return pg, asIs, nil
	}
	if !h.acquireRead(ctx) {
		if ctx.Err() != nil {
			return storage.Page{}, nil, ctx.Err()
		}
		return storage.Page{}, nil, ErrClosed
	}
	defer h.releaseRead()
	if fresh {
		cursor = maxSequence // read the head and the watermark only
	}
	pg, err := h.store.Read(ctx, storage.ReadRequest{Scope: topics, After: cursor, Limit: limit, MaxBytes: pollPageBytes})
	if fresh {
		pg.Watermark, pg.Foreign = 0, false // a fresh request is owed no gap
	}
	return pg, nil, err
}

// encodesAsIs reports whether raw is valid JSON that pollEncoder.raw
// would copy unchanged: compact, without <, >, &, U+2028 or U+2029.
func encodesAsIs(raw []byte) bool {
	if raw == nil || !validJSON(raw) {
		return false
	}
	inString := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '"':
			inString = !inString
		case c == '\\':
			i++
		case c == '<' || c == '>' || c == '&':
			return false
		case c == 0xE2 && i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xA8:
			return false
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}
