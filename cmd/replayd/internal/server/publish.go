package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"os"

	"github.com/replayd/replayd"
)

// maxBatch is the most events one POST /publish may carry.
const maxBatch = 1000

// maxData is the largest event data the library stores.
const maxData = 1 << 20

// publishItem is one event of a POST /publish body.
type publishItem struct {
	Topic string          `json:"topic"`
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Data  json.RawMessage `json:"data"`
}

// publishAnswer is a stored (or duplicate) event's answer.
type publishAnswer struct {
	Sequence  int64  `json:"sequence"`
	ID        string `json:"id"`
	Duplicate bool   `json:"duplicate"`
}

// errorAnswer is every refusal's body.
type errorAnswer struct {
	Error   string `json:"error"`
	Code    string `json:"code,omitempty"`    // which check refused, for 401 and 403 (docs/server.md)
	Outcome string `json:"outcome,omitempty"` // "unknown": retry with the same id
	status  int
}

// publishHandler serves POST /publish.
type publishHandler struct {
	hub     *replayd.EventHub
	keys    publishKeys
	maxBody int64
	log     *slog.Logger
}

func (p *publishHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, errorAnswer{Error: "method not allowed: POST only"})
		return
	}
	pats, ok := p.keys.lookup(r)
	if !ok {
		e := errorAnswer{Error: "an unknown publish key", Code: "key_unknown"}
		if _, given := bearer(r); !given {
			e = errorAnswer{Error: "no publish key: send Authorization: Bearer KEY", Code: "key_missing"}
		}
		p.log.Info("publish refused", "code", e.Code, "remote", r.RemoteAddr)
		w.Header().Set("WWW-Authenticate", `Bearer realm="replayd publish"`)
		writeJSON(w, http.StatusUnauthorized, e)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.maxBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorAnswer{Error: fmt.Sprintf("body over %d bytes", p.maxBody)})
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.Header().Set("Connection", "close")
			writeJSON(w, http.StatusRequestTimeout, errorAnswer{Error: "the body did not arrive within --read-timeout"})
			return
		}
		writeJSON(w, http.StatusBadRequest, errorAnswer{Error: "reading the body failed"})
		return
	}
	items, batch, err := parsePublish(r.Header.Get("Content-Type"), body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorAnswer{Error: err.Error()})
		return
	}
	answers := make([]any, len(items))
	var evs []replayd.Event
	var at []int // index in items of each of evs
	for i, it := range items {
		if e := p.check(it, pats); e != nil {
			answers[i] = *e
			if e.Code != "" {
				p.log.Info("publish refused", "code", e.Code, "topic", it.Topic, "item", i, "remote", r.RemoteAddr)
			}
			continue
		}
		evs = append(evs, replayd.Event{EventID: it.ID, Type: it.Type, Topic: it.Topic, Payload: it.Data})
		at = append(at, i)
	}
	if len(evs) > 0 {
		for j, res := range p.hub.PublishBatch(r.Context(), evs) {
			answers[at[j]] = p.answer(res)
		}
	}
	if !batch {
		if e, ok := answers[0].(errorAnswer); ok {
			writeJSON(w, e.status, e)
			return
		}
	}
	if batch {
		writeJSON(w, http.StatusOK, answers)
		return
	}
	writeJSON(w, http.StatusOK, answers[0])
}

// check refuses an item before it reaches the log: no data, data over the
// library's limit, or a topic the key may not publish to.
func (p *publishHandler) check(it publishItem, pats Patterns) *errorAnswer {
	switch {
	case len(it.Data) == 0:
		return &errorAnswer{Error: "data is required", status: http.StatusBadRequest}
	case len(it.Data) > maxData:
		return &errorAnswer{Error: fmt.Sprintf("data over %d bytes", maxData), status: http.StatusRequestEntityTooLarge}
	case !pats.Match(it.Topic):
		if it.Topic == "" {
			return &errorAnswer{Error: "this key may not broadcast (a broadcast needs the pattern *)", Code: "broadcast_not_allowed", status: http.StatusForbidden}
		}
		return &errorAnswer{Error: "this key may not publish to this topic", Code: "topic_not_allowed", status: http.StatusForbidden}
	}
	return nil
}

// answer turns one publish's result into its answer.
func (p *publishHandler) answer(res replayd.AppendResult) any {
	switch err := res.Err; {
	case err == nil:
		return publishAnswer{Sequence: res.Event.Sequence, ID: res.Event.EventID, Duplicate: res.Duplicate}
	case errors.Is(err, replayd.ErrInvalid):
		return errorAnswer{Error: err.Error(), status: http.StatusBadRequest}
	case errors.Is(err, replayd.ErrOutcomeUnknown):
		p.log.Warn("publish outcome unknown", "error", err)
		return errorAnswer{Error: "the event may or may not be stored: retry with the same id", Outcome: "unknown", status: http.StatusServiceUnavailable}
	default:
		p.log.Error("publish failed", "error", err)
		return errorAnswer{Error: "not stored: the log is unavailable", status: http.StatusServiceUnavailable}
	}
}

// parsePublish reads a publish body: a JSON object, a JSON array of up to
// maxBatch objects, or a form. batch reports an array.
func parsePublish(contentType string, body []byte) (items []publishItem, batch bool, err error) {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt == "application/x-www-form-urlencoded" {
		it, err := parseForm(body)
		return []publishItem{it}, false, err
	}
	body = bytes.TrimSpace(body)
	switch {
	case len(body) == 0:
		return nil, false, errors.New("empty body: send a JSON object, an array of them, or a form")
	case body[0] == '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(body, &raws); err != nil {
			return nil, true, fmt.Errorf("body: %v", err)
		}
		if len(raws) == 0 || len(raws) > maxBatch {
			return nil, true, fmt.Errorf("an array holds 1 to %d events, not %d", maxBatch, len(raws))
		}
		items = make([]publishItem, len(raws))
		for i, raw := range raws {
			if err := decodeItem(raw, &items[i]); err != nil {
				return nil, true, fmt.Errorf("item %d: %v", i, err)
			}
		}
		return items, true, nil
	case body[0] == '{':
		var it publishItem
		if err := decodeItem(body, &it); err != nil {
			return nil, false, err
		}
		return []publishItem{it}, false, nil
	}
	return nil, false, errors.New("body: not a JSON object or array")
}

// decodeItem decodes one event object, refusing fields it does not know.
func decodeItem(raw []byte, it *publishItem) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(it); err != nil {
		return fmt.Errorf("event: %v", err)
	}
	if d.More() {
		return errors.New("event: data after the object")
	}
	return nil
}

// parseForm reads a form-encoded event; data that is not valid JSON is
// stored as a JSON string.
func parseForm(body []byte) (publishItem, error) {
	v, err := url.ParseQuery(string(body))
	if err != nil {
		return publishItem{}, fmt.Errorf("form: %v", err)
	}
	for k, vs := range v {
		switch k {
		case "topic", "type", "id", "data":
			if len(vs) > 1 {
				return publishItem{}, fmt.Errorf("form: %s given %d times", k, len(vs))
			}
		default:
			return publishItem{}, fmt.Errorf("form: unknown field %q", k)
		}
	}
	it := publishItem{Topic: v.Get("topic"), Type: v.Get("type"), ID: v.Get("id")}
	if data, ok := v["data"]; ok {
		if json.Valid([]byte(data[0])) {
			it.Data = json.RawMessage(data[0])
		} else {
			it.Data = jsonString(data[0])
		}
	}
	return it, nil
}

// jsonString encodes s as a JSON string, leaving <, > and & as they are.
func jsonString(s string) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// writeJSON answers with status and v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
