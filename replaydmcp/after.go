package replaydmcp

import (
	"context"
	"fmt"
	"iter"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/storage"
)

// afterPage is how many rows After reads at a time.
const afterPage = 1000

// After implements [mcp.EventStore.After]: the data appended to the stream
// after index, in order. It reads them all before yielding the first, so
// that an error comes before any data: an unknown or closed session, an
// unknown stream, or, wrapping [mcp.ErrEventsPurged], a stream of which data
// after index was pruned (or may have been: see [EventStore]). Data after
// index is yielded only if all of it is there, from index+1 on without a
// hole.
//
// It reads the session's and the stream's rows from the oldest retained on,
// so its cost grows with the stream's retained length.
func (s *EventStore) After(ctx context.Context, sessionID, streamID string, index int) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		ds, err := s.after(ctx, sessionID, streamID, index)
		if err != nil {
			yield(nil, err)
			return
		}
		for _, d := range ds {
			if !yield(d, nil) {
				return
			}
		}
	}
}

func (s *EventStore) after(ctx context.Context, sessionID, streamID string, index int) ([][]byte, error) {
	stt, st := sessionTopic(sessionID), streamTopic(sessionID, streamID)
	purged := func() error {
		return fmt.Errorf("replaydmcp: After: index %d, stream ID %q, session %q: %w", index, streamID, sessionID, mcp.ErrEventsPurged)
	}
	var (
		sessionOpen, sessionClosed, streamOpen bool
		seenData                               bool
		prev                                   int // index of the last data row read
		watermark                              int64
		out                                    [][]byte
	)
	req := storage.ReadRequest{Scope: []string{stt, st}, Limit: afterPage}
	for first := true; ; first = false {
		page, err := s.st.Read(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("replaydmcp: After: %w", err)
		}
		if !first && page.Watermark > req.After && seenData {
			// Rows above what the last page read were pruned between
			// the two reads: the next data may be among them.
			return nil, purged()
		}
		watermark = page.Watermark
		for _, ev := range page.Events {
			switch {
			case ev.Topic == stt && ev.Type == typeSessionOpen:
				sessionOpen = true
				streamOpen = streamOpen || ev.EventID == openID(stt, st)
			case ev.Topic == stt && ev.Type == typeSessionClosed:
				sessionClosed = true
			case ev.Topic == st && isData(ev):
				idx, err := dataIndex(ev)
				if err != nil {
					return nil, err
				}
				if seenData && idx != prev+1 || !seenData && idx > index+1 {
					// A hole before the data after index, or in it.
					return nil, purged()
				}
				seenData, prev = true, idx
				if idx > index {
					d, err := decodeData(ev)
					if err != nil {
						return nil, err
					}
					out = append(out, d)
				}
			}
			req.After = ev.Sequence
		}
		if !page.More {
			break
		}
	}
	switch {
	case sessionClosed:
		return nil, fmt.Errorf("replaydmcp: After: unknown session ID %q: it was closed", sessionID)
	case seenData:
		// Retained from index+1 or before, without a hole.
		return out, nil
	case watermark == 0 && !sessionOpen:
		return nil, fmt.Errorf("replaydmcp: After: unknown session ID %q", sessionID)
	case watermark == 0 && !streamOpen:
		return nil, fmt.Errorf("replaydmcp: After: unknown stream ID %q in session %q", streamID, sessionID)
	case watermark == 0:
		return nil, nil // opened, nothing appended
	}
	// Nothing of the stream is retained, and rows of the session or the
	// stream were pruned: the stream's own watermark tells whether data of
	// it was (its topic holds data alone).
	page, err := s.st.Read(ctx, storage.ReadRequest{Scope: []string{st}, After: req.After, Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("replaydmcp: After: %w", err)
	}
	if page.Watermark > 0 || len(page.Events) > 0 {
		// Its data was pruned (its numbering with it), or data was
		// appended since the read: either way not provably complete.
		return nil, purged()
	}
	return nil, nil // the stream never had data: nothing was lost
}
