package durable

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// Forks. A PUT with Stream-Forked-From makes a stream that reads its
// source up to the fork offset (Stream-Fork-Offset, default the source's
// tail), then its own appends. Nothing is copied: the fork's record holds
// the chain of log segments it inherits (meta.Chain), which never change
// (offsets at or below a fork offset are history). Stream-Fork-Sub-Offset
// k copies the first k bytes (or JSON messages) that follow the fork
// offset as the fork's first own events. A source's record counts its
// live forks: deleting it while it has some soft-deletes it (410 to its
// own requests, its forks read on), and the last fork's deletion (or
// expiry, by the sweep) collects it, up the chain: its events are pruned
// then (sweep.go), never while a fork reads them.

// maxForkDepth bounds a fork chain.
const maxForkDepth = 16

// forkReq is what a PUT's fork headers ask for.
type forkReq struct {
	source    string // the source's topic
	offset    int64  // with offsetKind atSeq
	kind      offsetKind
	given     bool   // Stream-Fork-Offset was given
	raw       string // as given
	sub       int64
	subGiven  bool
	typeGiven bool
}

// parseFork reads a PUT's fork headers: nil for a plain create.
func (h *Handler) parseFork(r *http.Request) (*forkReq, *refusal) {
	from := r.Header.Get(hForkedFrom)
	offs := r.Header.Values(hForkOffset)
	subs := r.Header.Values(hForkSubOffset)
	if from == "" {
		if len(subs) > 0 || len(offs) > 0 {
			return nil, refuse(http.StatusBadRequest, "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From")
		}
		return nil, nil
	}
	src, err := h.topicFromHeader(from)
	if err != nil {
		return nil, refuse(http.StatusBadRequest, "invalid Stream-Forked-From: a stream path under "+h.prefix)
	}
	f := &forkReq{source: src, kind: atTail, typeGiven: mediaRE.MatchString(r.Header.Get("Content-Type"))}
	if len(offs) > 0 {
		kind, seq, ok := parseOffset(offs[0])
		if !ok || len(offs) > 1 || kind == atTail {
			return nil, refuse(http.StatusBadRequest, "invalid Stream-Fork-Offset")
		}
		f.kind, f.offset, f.given, f.raw = kind, seq, true, offs[0]
	}
	if len(subs) > 0 {
		n, ok := parseCount(subs[0])
		if !ok || len(subs) > 1 {
			return nil, refuse(http.StatusBadRequest, "invalid Stream-Fork-Sub-Offset")
		}
		if n > 0 && !f.given {
			return nil, refuse(http.StatusBadRequest, "Stream-Fork-Sub-Offset needs Stream-Fork-Offset")
		}
		f.sub, f.subGiven = n, true
	}
	return f, nil
}

// forkPlan is a fork resolved against its source, read before the create
// transaction (the history it names cannot change; the transaction checks
// that the source is still the same incarnation).
type forkPlan struct {
	req     *forkReq
	src     *meta
	offset  int64
	chain   []segment
	parents []string
	prefix  []json.RawMessage // the sub-offset's events
}

// planFork resolves f: 404 for a missing source, 409 for a deleted one or
// another content type, 400 for an offset that is not the source's.
func (h *Handler) planFork(ctx context.Context, f *forkReq, c *config) (*forkPlan, error) {
	v, err := h.readAt(ctx, f.source, f.kind, f.offset)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			switch ref.status {
			case http.StatusNotFound:
				return nil, refuse(http.StatusNotFound, "source stream not found")
			case http.StatusGone:
				if ref.code == "" {
					return nil, refuse(http.StatusConflict, "the source stream was deleted (its forks still read it)")
				}
				return nil, refuse(http.StatusBadRequest, "Stream-Fork-Offset is not an offset of the source stream")
			}
		}
		return nil, err
	}
	src := v.m
	if f.typeGiven && !sameType(c.contentType, src.ContentType) {
		return nil, refuse(http.StatusConflict, "content type mismatch with the source stream")
	}
	parents := append([]string{f.source}, src.Parents...)
	if len(parents) > maxForkDepth {
		return nil, refuse(http.StatusBadRequest, "fork chain deeper than "+strconv.Itoa(maxForkDepth))
	}
	p := &forkPlan{req: f, src: src, offset: v.after, parents: parents}
	if f.kind == atTail {
		p.offset = v.tail
	}
	for _, sg := range src.segments(f.source) {
		hi := sg.Hi
		if hi == 0 {
			hi = v.tail
		}
		if p.offset <= sg.Lo {
			break
		}
		p.chain = append(p.chain, segment{Topic: sg.Topic, Lo: sg.Lo, Hi: min(hi, p.offset)})
		if p.offset <= hi {
			break
		}
	}
	if f.sub > 0 {
		if p.prefix, err = subPrefix(encodingOf(src.ContentType), v, f.sub); err != nil {
			return nil, err
		}
	}
	c.contentType = src.ContentType
	if c.ttl == nil && c.expiresAt == "" {
		c.ttl, c.expiresAt, c.expires = src.TTL, src.ExpiresAt, src.Expires
	}
	return p, nil
}

// subPrefix is the first k messages (JSON) or bytes that follow the fork
// offset, as the fork's first own events.
func subPrefix(enc encoding, v *view, k int64) ([]json.RawMessage, error) {
	over := refuse(http.StatusBadRequest, "Stream-Fork-Sub-Offset is beyond what follows the fork offset")
	if enc == encJSON {
		if int64(len(v.events)) < k {
			return nil, over
		}
		out := make([]json.RawMessage, k)
		for i := range out {
			out[i] = v.events[i].Payload
		}
		return out, nil
	}
	var data []byte
	for _, ev := range v.events {
		data = append(data, dataBytes(enc, ev.Payload)...)
		if int64(len(data)) >= k {
			break
		}
	}
	if int64(len(data)) < k {
		return nil, over
	}
	ps, err := payloads(enc, data[:k], true)
	if err != nil {
		return nil, refuse(statusOf(err), err.Error())
	}
	return ps, nil
}

// matchesFork reports whether an existing stream was made by the same
// fork request.
func (f *forkReq) matches(m *meta) bool {
	if f == nil {
		return len(m.Parents) == 0
	}
	if len(m.Parents) == 0 || m.Parents[0] != f.source {
		return false
	}
	if f.given && f.raw != m.ForkOffsetArg {
		return false
	}
	return f.sub == m.ForkSub
}

// unfork drops a deleted fork's claim on its sources: each source's count
// of forks goes down, and a source deleted (or expired) meanwhile whose
// count reaches 0 is buried (sweep.go: its events are pruned once the
// transaction commits), up the chain.
func (t *txn) unfork(ctx context.Context, m *meta) error {
	for _, p := range m.Parents {
		pm, _, err := t.stream(ctx, p)
		if err != nil || pm == nil || pm.Tomb {
			return err
		}
		pm.Forks = max(pm.Forks-1, 0)
		if pm.Forks > 0 || pm.state(t.now) == alive {
			return t.put(ctx, p, pm)
		}
		last, err := t.Last(ctx, p)
		if err != nil {
			return err
		}
		if err := t.bury(ctx, p, pm, last); err != nil {
			return err
		}
	}
	return nil
}
