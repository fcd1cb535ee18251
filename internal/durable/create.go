package durable

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"time"
)

// PUT creates a stream, idempotently: the same configuration again is 200,
// another 409. A body is the stream's first data; Stream-Closed: true
// creates it closed.

// config is what a PUT asks for.
type config struct {
	contentType string
	ttl         *int64
	expiresAt   string
	expires     int64
	closed      bool
}

var (
	digitsRE  = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)
	mediaRE   = regexp.MustCompile(`^[\w.+-]+/[\w.+-]+`)
	maxTTLSec = int64(100 * 365 * 24 * 3600)
)

// parseConfig reads a PUT's headers; a *refusal for bad ones.
func parseConfig(r *http.Request) (config, *refusal) {
	var c config
	c.contentType = r.Header.Get("Content-Type")
	if !mediaRE.MatchString(c.contentType) {
		c.contentType = defaultDataType
	}
	ttl, exp := r.Header.Get(hTTL), r.Header.Get(hExpiresAt)
	if ttl != "" && exp != "" {
		return c, refuse(http.StatusBadRequest, "Stream-TTL and Stream-Expires-At cannot both be given")
	}
	if len(r.Header.Values(hTTL)) > 0 {
		n, err := strconv.ParseInt(ttl, 10, 64)
		if !digitsRE.MatchString(ttl) || err != nil || n > maxTTLSec {
			return c, refuse(http.StatusBadRequest, "invalid Stream-TTL: a number of seconds, digits only")
		}
		c.ttl = &n
	}
	if len(r.Header.Values(hExpiresAt)) > 0 {
		t, err := time.Parse(time.RFC3339Nano, exp)
		if err != nil {
			return c, refuse(http.StatusBadRequest, "invalid Stream-Expires-At: an RFC 3339 time")
		}
		c.expiresAt, c.expires = exp, t.UnixMilli()
	}
	c.closed = r.Header.Get(hClosed) == "true"
	return c, nil
}

// matches reports whether an existing stream was created with c.
func (c config) matches(m *meta) bool {
	sameTTL := (c.ttl == nil) == (m.TTL == nil) && (c.ttl == nil || *c.ttl == *m.TTL)
	return sameType(c.contentType, m.ContentType) && sameTTL && c.expiresAt == m.ExpiresAt && c.closed == m.Closed
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, topic string) {
	if r.Header.Get(hForkedFrom) != "" || r.Header.Get(hForkOffset) != "" {
		httpError(w, http.StatusNotImplemented, "forks are not supported yet")
		return
	}
	c, ref := parseConfig(r)
	if ref != nil {
		ref.answer(w)
		return
	}
	body, err := readBody(w, r, h.MaxBody)
	if err != nil {
		httpError(w, statusOf(err), err.Error())
		return
	}
	enc := encodingOf(c.contentType)
	created := false
	var m *meta
	var tail int64
	err = h.update(r.Context(), []string{topic}, func(t *txn) error {
		ctx := r.Context()
		old, ok, err := t.stream(ctx, topic)
		if err != nil {
			return err
		}
		if ok {
			if !c.matches(old) {
				return refuse(http.StatusConflict, "the stream exists with another configuration")
			}
			last, err := t.Last(ctx, topic)
			if err != nil {
				return err
			}
			created, m, tail = false, old, old.tail(last)
			return nil
		}
		var ps []json.RawMessage
		if len(body) > 0 {
			if ps, err = payloads(enc, body, true); err != nil {
				return refuse(statusOf(err), err.Error())
			}
		}
		m = &meta{ContentType: c.contentType, TTL: c.ttl, ExpiresAt: c.expiresAt, Expires: c.expires,
			Access: t.now.UnixMilli(), Created: t.now.UnixMilli()}
		if m.Base, err = t.marker(ctx, topic, markerCreate, map[string]string{"contentType": c.contentType}); err != nil {
			return err
		}
		last, err := t.appendEvents(ctx, topic, h.DataType, ps)
		if err != nil {
			return err
		}
		tail = max(m.Base, last)
		if c.closed {
			if err := t.close(ctx, topic, m, tail, nil); err != nil {
				return err
			}
		}
		created = true
		return t.put(ctx, topic, m)
	})
	if err != nil {
		h.answerErr(w, r, topic, err)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", m.ContentType)
	hd.Set(hNextOffset, formatOffset(tail))
	if m.Closed {
		hd.Set(hClosed, "true")
	}
	if !created {
		w.WriteHeader(http.StatusOK)
		return
	}
	hd.Set("Location", location(r))
	w.WriteHeader(http.StatusCreated)
}

// location is the absolute URL of the request's stream.
func location(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + r.URL.EscapedPath()
}

// close closes m in t at tail, appending the ds.close marker; by names the
// producer append that closes it, if any.
func (t *txn) close(ctx context.Context, topic string, m *meta, tail int64, by *producerKey) error {
	seq, err := t.marker(ctx, topic, markerClose, struct{}{})
	if err != nil {
		return err
	}
	m.Closed, m.ClosedAt, m.CloseSeq, m.ClosedBy = true, tail, seq, by
	return nil
}
