package durable

import (
	"context"
	"encoding/json"
	"errors"
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

// errExpired is a create's over the record of an expired stream that is
// not buried yet (sweep.go), which the transaction cannot bury: that
// writes the records of the stream's sources, whose locks it does not hold.
var errExpired = errors.New("replayd: durable streams: the stream expired and is not buried yet")

// matchesExisting reports whether an existing stream was created with c
// (and fork): a fork's inherited content type and expiry match when the
// request names none.
func (c config) matchesExisting(m *meta, fork *forkReq) bool {
	if !fork.matches(m) || c.closed != m.Closed {
		return false
	}
	if fork != nil && !fork.typeGiven {
		// inherited
	} else if !sameType(c.contentType, m.ContentType) {
		return false
	}
	if fork != nil && c.ttl == nil && c.expiresAt == "" {
		return true
	}
	sameTTL := (c.ttl == nil) == (m.TTL == nil) && (c.ttl == nil || *c.ttl == *m.TTL)
	return sameTTL && c.expiresAt == m.ExpiresAt
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, topic string) {
	c, ref := parseConfig(r)
	if ref != nil {
		ref.answer(w)
		return
	}
	fork, ref := h.parseFork(r)
	if ref != nil {
		ref.answer(w)
		return
	}
	body, err := readBody(w, r, h.MaxBody)
	if err != nil {
		httpError(w, statusOf(err), err.Error())
		return
	}
	ctx := r.Context()
	topics := []string{topic}
	var plan *forkPlan
	if fork != nil {
		if fork.source == topic {
			httpError(w, http.StatusBadRequest, "a stream cannot be forked from itself")
			return
		}
		// An existing stream is answered before its source is looked at.
		if v, err := h.readAt(ctx, topic, atTail, 0); err == nil {
			h.created(w, r, v.m, v.tail, false, c.matchesExisting(v.m, fork))
			return
		}
		if plan, err = h.planFork(ctx, fork, &c); err != nil {
			h.answerErr(w, r, topic, err)
			return
		}
		topics = append(topics, fork.source)
	}
	created, same := false, true
	var m *meta
	var tail int64
	txfn := func(t *txn) error {
		old, st, err := t.stream(ctx, topic)
		switch {
		case err != nil:
			return err
		case st == gone:
			return refuse(http.StatusConflict, "the stream was deleted while forks read it: its path cannot be reused until they are gone")
		case st == alive:
			last, err := t.Last(ctx, topic)
			if err != nil {
				return err
			}
			created, m, tail, same = false, old, old.tail(last), c.matchesExisting(old, fork)
			return nil
		case old != nil && !old.Tomb:
			return errExpired
		}
		enc := encodingOf(c.contentType)
		var ps []json.RawMessage
		if len(body) > 0 {
			if ps, err = payloads(enc, body, true); err != nil {
				return refuse(statusOf(err), err.Error())
			}
		}
		m = &meta{ContentType: c.contentType, TTL: c.ttl, ExpiresAt: c.expiresAt, Expires: c.expires,
			Access: t.now.UnixMilli(), Created: t.now.UnixMilli()}
		if old != nil {
			m.Reclaim = old.Reclaim // the tombstone's: the sweep prunes the earlier incarnation still
		}
		if plan != nil {
			src, sst, err := t.stream(ctx, fork.source)
			switch {
			case err != nil:
				return err
			case sst == absent:
				return refuse(http.StatusNotFound, "source stream not found")
			case sst == gone:
				return refuse(http.StatusConflict, "the source stream was deleted (its forks still read it)")
			case src.Base != plan.src.Base:
				return refuse(http.StatusConflict, "the source stream was replaced meanwhile: retry")
			}
			src.Forks++
			if err := t.put(ctx, fork.source, src); err != nil {
				return err
			}
			m.Parents, m.Chain, m.ForkOffset, m.ForkOffsetArg, m.ForkSub = plan.parents, plan.chain, plan.offset, fork.raw, fork.sub
			ps = append(plan.prefix, ps...)
		}
		if m.Base, err = t.marker(ctx, topic, markerCreate, createMarker{ContentType: c.contentType, ForkedFrom: m.Parents, ForkOffset: m.ForkOffset}); err != nil {
			return err
		}
		last, err := t.appendEvents(ctx, topic, h.DataType, ps)
		if err != nil {
			return err
		}
		tail = m.tail(last)
		if c.closed {
			if err := t.close(ctx, topic, m, tail, nil); err != nil {
				return err
			}
		}
		created = true
		return t.put(ctx, topic, m)
	}
	err = h.update(ctx, topics, txfn)
	if errors.Is(err, errExpired) {
		// An expired stream the sweep has not buried yet: bury it (with
		// its sources' locks), then create over its tombstone.
		if err = h.sweeper().buryExpired(ctx, topic); err == nil {
			err = h.update(ctx, topics, txfn)
		}
	}
	if err != nil {
		h.answerErr(w, r, topic, err)
		return
	}
	h.created(w, r, m, tail, created, same)
}

// createMarker is the payload of a ds.create marker: what a Handler()
// reader of the topic learns of the stream.
type createMarker struct {
	ContentType string   `json:"contentType"`
	ForkedFrom  []string `json:"forkedFrom,omitempty"` // source topics, nearest first
	ForkOffset  int64    `json:"forkOffset,omitempty"`
}

// created answers a PUT: 201 for a new stream, 200 for the same
// configuration again, 409 for another.
func (h *Handler) created(w http.ResponseWriter, r *http.Request, m *meta, tail int64, created, same bool) {
	if !same {
		httpError(w, http.StatusConflict, "the stream exists with another configuration")
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
