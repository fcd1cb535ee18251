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

	// A fork (fork.go): Parents are its source, the source's source and so
	// on; ForkOffset and ForkSub the Stream-Fork-Offset and
	// Stream-Fork-Sub-Offset it was made with (ForkOffsetArg: the offset as
	// the client named it, "" for the default); Chain the inherited segments of the log it reads
	// before its own, oldest first. A stream's Forks counts the live
	// forks made from it; Deleted marks a stream deleted while it had
	// some (soft-deleted: its forks still read it).
	Parents       []string  `json:"parents,omitempty"`
	ForkOffset    int64     `json:"forkOffset,omitempty"`
	ForkOffsetArg string    `json:"forkOffsetArg,omitempty"`
	ForkSub       int64     `json:"forkSub,omitempty"`
	Chain         []segment `json:"chain,omitempty"`
	Forks         int64     `json:"forks,omitempty"`
	Deleted       bool      `json:"deleted,omitempty"`

	// The log to reclaim (sweep.go). Reclaim is the sequence through which
	// the topic's events belong to incarnations nothing reads any more:
	// the sweep prunes them (storage.TopicPruner) and clears it. Tomb
	// marks a tombstone: the record of a stream that was deleted, or
	// expired, kept only until its Reclaim is done (a stream is absent
	// meanwhile, and can be created again: the new record takes the
	// tombstone's Reclaim over).
	Reclaim int64 `json:"reclaim,omitempty"`
	Tomb    bool  `json:"tomb,omitempty"`
}

// A segment is a range of a topic's events a stream reads: those with a
// sequence in (Lo, Hi], Hi 0 meaning up to the stream's tail. A stream
// reads its chain's segments, then its own, (Base, tail]; the ranges
// ascend and never overlap (a fork's base is above its fork offset), so
// offsets ascend across them.
type segment struct {
	Topic string `json:"topic"`
	Lo    int64  `json:"lo"`
	Hi    int64  `json:"hi"`
}

// segments are the ranges a read of the stream of topic walks.
func (m *meta) segments(topic string) []segment {
	own := segment{Topic: topic, Lo: m.Base}
	if m.Closed {
		own.Hi = m.ClosedAt
		if own.Hi < own.Lo {
			own.Hi = own.Lo // closed with nothing of its own: an empty range
		}
	}
	return append(append(make([]segment, 0, len(m.Chain)+1), m.Chain...), own)
}

// start is the offset of the stream's beginning: the first segment's.
func (m *meta) start() int64 {
	if len(m.Chain) > 0 {
		return m.Chain[0].Lo
	}
	return m.Base
}

// A state is what a stream's record says of it now.
type state int

const (
	absent state = iota // no stream (none, or expired with no fork reading it)
	gone                // deleted or expired while forks read it: 410
	alive
)

func (m *meta) state(now time.Time) state {
	switch {
	case m == nil, m.Tomb:
		return absent
	case m.Deleted:
		return gone
	case m.expired(now) && m.Forks > 0:
		return gone
	case m.expired(now):
		return absent
	}
	return alive
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

// record is m as topic's stored record, at now.
func (m *meta) record(topic string, now time.Time) (storage.StreamRecord, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return storage.StreamRecord{}, err
	}
	return storage.StreamRecord{Topic: topic, Meta: b, ExpiresAt: m.due(now)}, nil
}

// due is when the sweep must look at the record (Unix ms; 0: never), kept
// as its storage.StreamRecord's ExpiresAt, which StreamStore.DueStreams
// lists by: at once (1) when it has log to reclaim; never for a stream
// its forks hold (deleted, or expired, while forks read it: the last
// fork's deletion collects it, unfork); else when it expires.
func (m *meta) due(now time.Time) int64 {
	switch {
	case m.Reclaim > 0 || m.Tomb:
		return 1
	case m.Forks > 0 && (m.Deleted || m.expired(now)):
		return 0
	}
	return m.expiry()
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
	switch {
	case m.Closed:
		return m.ClosedAt
	case last > m.Base:
		return last
	case len(m.Chain) > 0:
		return m.Chain[len(m.Chain)-1].Hi // a fork with nothing of its own yet
	}
	return m.Base
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
