package durable

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"

	"github.com/replayd/replayd/internal/live"
	"github.com/replayd/replayd/storage"
)

// live=sse: the stream as `event: data` frames, each followed by an
// `event: control` frame with the offset after it, then live as appends
// come, until SSEFor has passed (the client reconnects from the last
// control's offset) or the stream's close (a final control with
// streamClosed). A payload's lines are each their own data: field, so no
// payload can end a frame or forge an event. A stream that is neither
// JSON nor text is sent as base64 (Stream-SSE-Data-Encoding: base64).

// heartbeat is how often an idle SSE response sends a comment.
const heartbeat = 15 * time.Second

type control struct {
	NextOffset string `json:"streamNextOffset"`
	Cursor     string `json:"streamCursor,omitempty"`
	UpToDate   bool   `json:"upToDate,omitempty"`
	Closed     bool   `json:"streamClosed,omitempty"`
}

func (h *Handler) sse(w http.ResponseWriter, r *http.Request, topic string, v *view, waiter *live.Waiter) {
	ctx := r.Context()
	release, ok := h.AcquireSlot()
	if !ok {
		w.Header().Set("Retry-After", "1")
		httpError(w, http.StatusServiceUnavailable, "server busy, retry later")
		return
	}
	defer release()
	enc := encodingOf(v.m.ContentType)
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	if enc == encBase64 {
		hd.Set(hSSEEncoding, "base64")
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	client := r.URL.Query().Get("cursor")
	end := time.NewTimer(h.SSEFor)
	defer end.Stop()
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	var buf []byte
	for first := true; ; first = false {
		closed := v.m.Closed && v.upToDate()
		if first || closed || len(v.events) > 0 {
			buf = h.appendFrames(buf[:0], enc, v, client)
			if _, err := w.Write(buf); err != nil {
				return
			}
			rc.Flush()
		}
		if closed {
			return
		}
		if !v.more && !h.awaitAppend(w, rc, waiter, end.C, beat.C, ctx.Done()) {
			return
		}
		next, err := h.readAfter(ctx, topic, v.m, v.next())
		if err != nil {
			return
		}
		v = next
	}
}

// appendFrames appends v's page as frames: each data event and a control
// after it; a lone control for an empty page; the final control of a
// closed stream at its tail.
func (h *Handler) appendFrames(b []byte, enc encoding, v *view, client string) []byte {
	evs := v.events
	up := v.upToDate()
	closedAt := func(seq int64) bool { return v.m.Closed && up && seq >= v.m.ClosedAt }
	ctl := func(seq int64, last bool) control {
		c := control{NextOffset: formatOffset(seq)}
		if last && closedAt(seq) {
			c.Closed = true
		} else {
			c.Cursor, c.UpToDate = h.cursor(client), last && up
		}
		return c
	}
	for i := range evs {
		b = appendData(b, enc, &evs[i])
		b = appendControl(b, ctl(evs[i].Sequence, i == len(evs)-1))
	}
	if len(evs) == 0 {
		b = appendControl(b, ctl(v.after, true))
	}
	return b
}

// awaitAppend waits until the waiter is woken (true), sending heartbeats;
// false when the response should end.
func (h *Handler) awaitAppend(w http.ResponseWriter, rc *http.ResponseController, waiter *live.Waiter, end <-chan time.Time, beat <-chan time.Time, done <-chan struct{}) bool {
	for {
		select {
		case <-waiter.Woken():
			h.Live.AddWaiter(waiter) // before the next read
			return true
		case <-beat:
			if _, err := w.Write([]byte(":\n\n")); err != nil {
				return false
			}
			rc.Flush()
		case <-end:
			return false
		case <-h.Done:
			return false
		case <-done:
			return false
		}
	}
}

// appendData appends ev as an `event: data` frame.
func appendData(b []byte, enc encoding, ev *storage.Event) []byte {
	var data []byte
	switch enc {
	case encJSON:
		data = append(append([]byte{'['}, ev.Payload...), ']')
	case encBase64:
		data = []byte(base64.StdEncoding.EncodeToString(dataBytes(enc, ev.Payload)))
	default:
		data = dataBytes(enc, ev.Payload)
	}
	b = append(b, "event: data\n"...)
	return appendLines(b, data)
}

func appendControl(b []byte, c control) []byte {
	j, _ := json.Marshal(c)
	b = append(b, "event: control\n"...)
	return appendLines(b, j)
}

// appendLines appends data as data: fields (no space after the colon:
// the protocol's suite matches "data:{"), one per line (CR, LF or CRLF
// end a line), and the blank line that ends the frame.
func appendLines(b, data []byte) []byte {
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		b = append(append(append(b, "data:"...), data[:i]...), '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b = append(append(append(b, "data:"...), data...), '\n')
	return append(b, '\n')
}
