package durable

import (
	"encoding/json"
	"fmt"
	"mime"
	"strings"
	"time"

	"github.com/replayd/replayd/storage"
)

// meta is a stream's metadata, kept as the Meta of its storage.StreamRecord
// (JSON): the store keeps it opaque.
type meta struct {
	// Base is the sequence of the stream's ds.create marker: the offset of
	// the empty stream. A topic's earlier incarnations are below it.
	Base        int64  `json:"base"`
	ContentType string `json:"contentType"`
	// TTL is Stream-TTL in seconds (nil: none); Access is the last read or
	// write (Unix ms) it slides from. ExpiresAt is Stream-Expires-At as
	// given (RFC 3339), Expires the same in Unix ms.
	TTL       *int64 `json:"ttl,omitempty"`
	Access    int64  `json:"access"`
	ExpiresAt string `json:"expiresAt,omitempty"`
	Expires   int64  `json:"expires,omitempty"`
	// Closed: the stream was closed; its tail is then ClosedAt (the last
	// data event's sequence, or the base), and ClosedBy names the
	// producer append that closed it, so that its retry is a duplicate.
	Closed   bool         `json:"closed,omitempty"`
	ClosedAt int64        `json:"closedAt,omitempty"`
	CloseSeq int64        `json:"closeSeq,omitempty"` // the ds.close marker
	ClosedBy *producerKey `json:"closedBy,omitempty"`
	// StreamSeq is the last Stream-Seq accepted (compared byte-wise).
	StreamSeq string `json:"streamSeq,omitempty"`
	Created   int64  `json:"created"`
}

// producerKey names one producer append.
type producerKey struct {
	ID    string `json:"id"`
	Epoch int64  `json:"epoch"`
	Seq   int64  `json:"seq"`
}

func decodeMeta(rec storage.StreamRecord) (*meta, error) {
	var m meta
	if err := json.Unmarshal(rec.Meta, &m); err != nil {
		return nil, fmt.Errorf("replayd: stream %q: bad record: %w", rec.Topic, err)
	}
	return &m, nil
}

func (m *meta) record(topic string) (storage.StreamRecord, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return storage.StreamRecord{}, err
	}
	return storage.StreamRecord{Topic: topic, Meta: b, ExpiresAt: m.expiry()}, nil
}

// expiry is when the stream expires (Unix ms), 0: never.
func (m *meta) expiry() int64 {
	var e int64
	if m.TTL != nil {
		e = m.Access + *m.TTL*1000
	}
	if m.Expires != 0 && (e == 0 || m.Expires < e) {
		e = m.Expires
	}
	return e
}

func (m *meta) expired(now time.Time) bool {
	e := m.expiry()
	return e != 0 && now.UnixMilli() >= e
}

// tail is the offset of the stream's end, given the sequence of the
// topic's newest event (storage.StreamPage.Last).
func (m *meta) tail(last int64) int64 {
	if m.Closed {
		return m.ClosedAt
	}
	return max(m.Base, last)
}

// An encoding is how a stream's bytes are kept in the log's JSON payloads.
type encoding int

const (
	encJSON   encoding = iota // application/json: one event per message, the message as payload
	encText                   // text/*: a JSON string of the text per chunk
	encBase64                 // anything else: a JSON string of the chunk's standard base64
)

// mediaType is a content type's media type, lower case, without
// parameters ("" when it has none).
func mediaType(ct string) string {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		mt, _, _ = strings.Cut(ct, ";")
		mt = strings.ToLower(strings.TrimSpace(mt))
	}
	return mt
}

func encodingOf(ct string) encoding {
	mt := mediaType(ct)
	switch {
	case mt == "application/json":
		return encJSON
	case strings.HasPrefix(mt, "text/"):
		return encText
	}
	return encBase64
}

// sameType compares content types as the protocol does: media types,
// case-insensitively, parameters ignored.
func sameType(a, b string) bool { return mediaType(a) == mediaType(b) }
