package replaydmcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/storage"
)

// EventStore is an [mcp.EventStore] on a replayd log: the SSE streams of an
// MCP server's streamable-HTTP sessions, stored so that a client resumes
// them with Last-Event-ID after the server restarts, or on another server
// process over the same log (a shared SQLite file, or PostgreSQL through
// module github.com/replayd/replayd/replaydpg). Make one with [New].
//
// It keeps the interface's contract as the SDK's own [mcp.MemoryEventStore]
// does, with these differences, all forced by a durable log shared by
// processes:
//
//   - Retention is the log's: [Options.Retention] (a count of the newest
//     events, an age), applied by [EventStore.Prune], not a byte budget
//     shared round-robin among streams. The log deletes only its oldest
//     events, so a stream loses a prefix, never a middle.
//   - SessionClosed makes the session's data unreachable at once (After
//     answers an error for it), then deletes its streams' rows with the
//     store's per-topic prune (storage.TopicPruner); the mark of its end
//     stays until retention deletes it.
//   - After answers [mcp.ErrEventsPurged] whenever it cannot prove that
//     nothing after index was dropped; that includes a stream whose every
//     row was pruned (its numbering is gone with them), where the memory
//     store, which keeps an empty stream's count, could answer "nothing".
//     It never returns partial results.
//
// The log must be the event store's own (an SQLite file, a replaydpg table
// prefix): a broadcast event published to it by a replayd hub would be
// visible to every stream, and its retention to every watermark.
//
// All methods are safe for concurrent use, also by several processes
// sharing the log.
type EventStore struct {
	st   storage.Store
	opts Options

	mu       sync.Mutex                         // guards sessions
	sessions map[string]map[string]*streamState // session id -> stream id -> state; a cache (see maxSessions)

	lastPrune atomic.Int64 // unix nanoseconds of the last automatic prune
}

// streamState is what a process knows of one stream it appends to.
type streamState struct {
	mu    sync.Mutex // held through an Append of the stream
	known bool       // next is the stream's next index
	next  int
}

var _ mcp.EventStore = (*EventStore)(nil)

// Options configure an [EventStore]. The zero value keeps every event until
// something else prunes the log.
type Options struct {
	// Retention bounds the log: Prune deletes what it condemns (see
	// storage.RetentionPolicy). Zero: Prune deletes nothing.
	Retention storage.RetentionPolicy
	// PruneInterval, with Retention set, makes Append run Prune itself
	// when the last one it ran is older than this (on the appending
	// goroutine: the store starts none). Zero: a minute. Negative: Append
	// never prunes; call Prune yourself.
	PruneInterval time.Duration
	// Logger, if not nil, is told of a Prune that Append ran and that
	// failed.
	Logger *slog.Logger
}

// New returns an event store on st. It never closes st: whoever opened it
// closes it, after the last call to the event store.
func New(st storage.Store, opts Options) *EventStore {
	if opts.PruneInterval == 0 {
		opts.PruneInterval = time.Minute
	}
	s := &EventStore{st: st, opts: opts, sessions: map[string]map[string]*streamState{}}
	s.lastPrune.Store(time.Now().UnixNano())
	return s
}

// maxSessions bounds the sessions whose streams' next index a store keeps
// in memory. Past it the cache is emptied: it is only a cache (a stream
// not in it is read from the log), and the log refuses an index taken
// twice, so forgetting costs reads, never correctness. A session that ends
// without SessionClosed (its server killed, or adopted elsewhere) would
// otherwise stay forever.
const maxSessions = 1 << 16

// stream returns the state of a stream, made if missing.
func (s *EventStore) stream(sessionID, streamID string) *streamState {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.sessions[sessionID]
	if m == nil {
		if len(s.sessions) >= maxSessions {
			clear(s.sessions)
		}
		m = map[string]*streamState{}
		s.sessions[sessionID] = m
	}
	st := m[streamID]
	if st == nil {
		st = &streamState{}
		m[streamID] = st
	}
	return st
}

// Open implements [mcp.EventStore.Open]: it records, in one write, that the
// session and the stream exist (a stream opened before, by this process or
// another, is left as it is). It is one row on the session's topic per
// stream (a row per request), so a session in use keeps a recent one
// when retention deletes the oldest rows: [Handler] serves a session from
// another process only while the log holds one.
func (s *EventStore) Open(ctx context.Context, sessionID, streamID string) error {
	stt, st := sessionTopic(sessionID), streamTopic(sessionID, streamID)
	res, err := s.st.Append(ctx, []storage.Event{
		{EventID: openID(stt, st), Type: typeSessionOpen, Topic: stt, Payload: []byte("{}")},
	})
	if err == nil && res[0].Err != nil {
		err = res[0].Err
	}
	if err != nil {
		return fmt.Errorf("replaydmcp: Open: %w", err)
	}
	if !res[0].Duplicate {
		ss := s.stream(sessionID, streamID)
		ss.mu.Lock()
		ss.known, ss.next = true, 0
		ss.mu.Unlock()
	}
	return nil
}

// errNumberingLost is returned by an Append to a stream whose every row was
// pruned, by a process that did not append to it before: the index to give
// the data is gone with them.
var errNumberingLost = errors.New("replaydmcp: the stream's rows were all pruned, and its numbering with them")

// Append implements [mcp.EventStore.Append]: it stores data, byte for
// byte, as the stream's next index, and returns once it is durably
// committed. The index is the stream's count of appends, from 0, as the SDK
// numbers its SSE ids: kept in memory by the process that appends, and read
// back from the log by a process that did not (a server restarted, another
// node). Two processes appending to one stream at once get distinct,
// consecutive indices (the log refuses an index taken, and the loser reads
// the stream again).
func (s *EventStore) Append(ctx context.Context, sessionID, streamID string, data []byte) error {
	topic := streamTopic(sessionID, streamID)
	typ, payload := encodeData(data)
	ss := s.stream(sessionID, streamID)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for range 8 {
		if !ss.known {
			next, err := s.nextIndex(ctx, topic)
			if err != nil {
				return fmt.Errorf("replaydmcp: Append to stream %q of session %q: %w", streamID, sessionID, err)
			}
			ss.known, ss.next = true, next
		}
		res, err := s.st.Append(ctx, []storage.Event{{EventID: dataID(topic, ss.next), Type: typ, Topic: topic, Payload: payload}})
		if err != nil {
			ss.known = false // it may have committed: read the stream again
			return fmt.Errorf("replaydmcp: Append: %w", err)
		}
		if res[0].Err != nil {
			return fmt.Errorf("replaydmcp: Append: %w", res[0].Err)
		}
		if res[0].Duplicate {
			ss.known = false // another process took this index
			continue
		}
		ss.next++
		s.maybePrune(ctx)
		return nil
	}
	return fmt.Errorf("replaydmcp: Append to stream %q of session %q: lost the race for an index 8 times", streamID, sessionID)
}

// nextIndex reads the next index of the stream on topic from the log: one
// above its newest data; 0 for a stream without any, ever.
func (s *EventStore) nextIndex(ctx context.Context, topic string) (int, error) {
	scope := []string{topic}
	w, err := s.st.Window(ctx, scope, 0, 1)
	if err != nil {
		return 0, err
	}
	// The window of one event is the stream's newest; read it. (A row
	// appended between the two reads makes the index stale: the log then
	// refuses it as a duplicate, and Append reads again.)
	page, err := s.st.Read(ctx, storage.ReadRequest{Scope: scope, After: w.From - 1, Limit: 1})
	if err != nil {
		return 0, err
	}
	if len(page.Events) == 0 { // nothing retained
		if page.Watermark > 0 {
			return 0, errNumberingLost
		}
		return 0, nil
	}
	idx, err := dataIndex(page.Events[0])
	return idx + 1, err
}

// SessionClosed implements [mcp.EventStore.SessionClosed]: it records, in
// one write, that the session is finished; After then answers an error for
// every stream of it, in every process. Then it deletes the session's data:
// over a store that deletes one topic's events (storage.TopicPruner, as
// replayd's SQLite and PostgreSQL stores do), every stream's rows and the
// session's own but the mark of its end, which stays until retention
// deletes it with the log's oldest rows, so that After keeps answering
// "closed" rather than "unknown". The mark is written first: a process
// reading the session meanwhile sees it closed, never a stream cut short.
// A deletion that fails leaves the rows to retention, and is returned.
func (s *EventStore) SessionClosed(ctx context.Context, sessionID string) error {
	stt := sessionTopic(sessionID)
	res, err := s.st.Append(ctx, []storage.Event{{EventID: "closed/" + stt, Type: typeSessionClosed, Topic: stt, Payload: []byte("{}")}})
	if err == nil && res[0].Err != nil {
		err = res[0].Err
	}
	if err != nil {
		return fmt.Errorf("replaydmcp: SessionClosed: %w", err)
	}
	s.mu.Lock()
	delete(s.sessions, sessionID)
	s.mu.Unlock()
	if err := s.reclaim(ctx, stt, res[0].Event.Sequence); err != nil {
		return fmt.Errorf("replaydmcp: SessionClosed: delete the session's rows: %w", err)
	}
	return nil
}

// reclaim deletes the rows of the closed session on topic stt, whose end
// is marked at sequence closed: each stream's (named by the session's open
// records), then the session's own below the mark.
func (s *EventStore) reclaim(ctx context.Context, stt string, closed int64) error {
	tp, ok := s.st.(storage.TopicPruner)
	if !ok {
		return nil // retention deletes them
	}
	req := storage.ReadRequest{Scope: []string{stt}, Limit: afterPage, Through: closed}
	for {
		page, err := s.st.Read(ctx, req)
		if err != nil {
			return err
		}
		for _, ev := range page.Events {
			if st, ok := strings.CutPrefix(ev.EventID, "open/"+stt+"/"); ok && ev.Type == typeSessionOpen {
				if _, err := tp.PruneTopic(ctx, st, math.MaxInt64); err != nil {
					return err
				}
			}
			req.After = ev.Sequence
		}
		if !page.More {
			break
		}
	}
	_, err := tp.PruneTopic(ctx, stt, closed-1)
	return err
}

// Prune deletes what [Options.Retention] condemns from the log, oldest
// first, and returns how many events it deleted (also when it fails part
// way). A stream whose oldest data it deleted answers [mcp.ErrEventsPurged]
// to a resumption from before them. Several processes may prune one log at
// once.
func (s *EventStore) Prune(ctx context.Context) (int64, error) {
	if s.opts.Retention.IsZero() {
		return 0, nil
	}
	s.lastPrune.Store(time.Now().UnixNano())
	return s.st.Prune(ctx, s.opts.Retention)
}

// maybePrune runs Prune when PruneInterval has passed since the last one;
// one appender wins the turn.
func (s *EventStore) maybePrune(ctx context.Context) {
	if s.opts.Retention.IsZero() || s.opts.PruneInterval < 0 {
		return
	}
	last := s.lastPrune.Load()
	now := time.Now().UnixNano()
	if now-last < int64(s.opts.PruneInterval) || !s.lastPrune.CompareAndSwap(last, now) {
		return
	}
	if _, err := s.st.Prune(ctx, s.opts.Retention); err != nil && s.opts.Logger != nil {
		s.opts.Logger.Warn("replaydmcp: prune", "err", err)
	}
}
