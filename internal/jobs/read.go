package jobs

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/storage"
)

// Poll is one read of a job from text offset Since and event offset
// EventSince: what the record said (Info, in one snapshot with the first
// page of the stream) and the text and events past those offsets, up to
// what that record counts (so the text and the status agree: a job that
// says complete has all of its text in Append).
type Poll struct {
	Info
	Append          string            // the text from Since (UTF-16 offset) on
	NextOffset      int64             // Since + Append's UTF-16 length: the committed text's length
	Events          []json.RawMessage // the events from EventSince on
	NextEventOffset int64
	// Text and AllEvents are the whole text and every event, filled when
	// Read was asked for everything (all) and the job ended complete.
	Text      *string
	AllEvents []json.RawMessage
}

// readPage is how many events one store read returns; firstPage the
// first's, which also reads the record.
const (
	readPage  = 500
	firstPage = 16
)

// readAfter is the store read of topic's messages after a sequence.
func readAfter(topic string, s *durable.AppStream, after int64) storage.StreamReadRequest {
	req := storage.StreamReadRequest{Topic: topic, After: after, Limit: readPage}
	if s.Closed {
		req.Through = s.Tail
	}
	return req
}

// Read reads job id from text offset since and event offset eventSince
// (clamped to what was committed); all also fills Text and AllEvents of a
// complete job. It counts as a read for abandonment. ErrNotFound: no
// such job (never started, or deleted after its retention).
func (m *Manager) Read(ctx context.Context, id string, since, eventSince int64, all bool) (*Poll, error) {
	if !validID(id) {
		return nil, ErrNotFound
	}
	topic := m.topic(id)
	// The record, in one snapshot with the stream's first few messages
	// (a short answer's all); a longer one is read from its mark (index.go).
	page, err := m.cfg.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: topic, Limit: firstPage})
	if err != nil {
		return nil, err
	}
	if !page.Found {
		return nil, ErrNotFound
	}
	s, err := durable.AppOf(page.Record, m.cfg.Now())
	if err != nil {
		return nil, err
	}
	if s == nil || s.App == nil {
		return nil, ErrNotFound
	}
	rec, err := decodeRecord(s.App)
	if err != nil {
		return nil, err
	}
	if rec.Status == Streaming && rec.Lease < m.cfg.Now().UnixMilli() {
		// Its node died: end it, and read again what that committed.
		if _, err := m.settle(ctx, topic, rec); err != nil {
			return nil, err
		}
		return m.Read(ctx, id, since, eventSince, all)
	}
	m.touch(ctx, rec)
	since = min(max(since, 0), rec.Text)
	eventSince = min(max(eventSince, 0), rec.Events)
	p := &Poll{Info: m.info(rec), NextOffset: rec.Text, NextEventOffset: rec.Events}
	whole := all && rec.Status == Complete
	var text, whole16 strings.Builder
	after := s.Base
	if at := rec.markFor(since, eventSince); !whole && page.More && at > after {
		if n := len(page.Events); n == 0 || at > page.Events[n-1].Sequence {
			after = at
			if page, err = m.cfg.Store.ReadStream(ctx, readAfter(topic, s, after)); err != nil {
				return nil, err
			}
		}
	}
	for {
		for _, ev := range page.Events {
			if ev.Sequence <= after {
				continue
			}
			after = ev.Sequence
			if ev.Type != m.cfg.DataType {
				continue // a marker
			}
			var msg message
			if json.Unmarshal(ev.Payload, &msg) != nil {
				continue // not a job's message (written to the topic by other means)
			}
			switch {
			case msg.K == kindText && msg.O != nil:
				o := *msg.O
				if o >= rec.Text {
					continue
				}
				if whole {
					whole16.WriteString(msg.T)
				}
				if end := o + len16(msg.T); end > since {
					text.WriteString(from16(msg.T, since-o))
				}
			case msg.K == kindEvent && msg.N != nil:
				n := *msg.N
				if n >= rec.Events {
					continue
				}
				if whole {
					p.AllEvents = append(p.AllEvents, msg.E)
				}
				if n >= eventSince {
					p.Events = append(p.Events, msg.E)
				}
			}
		}
		if !page.More || (s.Closed && after >= s.Tail) {
			break
		}
		if page, err = m.cfg.Store.ReadStream(ctx, readAfter(topic, s, after)); err != nil {
			return nil, err
		}
	}
	p.Append = text.String()
	if whole {
		t := whole16.String()
		p.Text = &t
		if p.AllEvents == nil {
			p.AllEvents = []json.RawMessage{}
		}
	}
	if p.Events == nil {
		p.Events = []json.RawMessage{}
	}
	return p, nil
}
