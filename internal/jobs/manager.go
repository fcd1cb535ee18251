package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/replayd/replayd/internal/durable"
	"github.com/replayd/replayd/storage"
)

// Config is a Manager's: the hub's parts and the job options.
type Config struct {
	Store    storage.StreamStore
	Deliver  func([]storage.Event) // wakes live readers of committed events
	DataType string                // the hub's default event type
	Sweeper  *durable.Sweeper      // buries an expired job's stream before its id is started again
	// Go runs fn on a goroutine the hub waits for at Close (ErrClosed
	// once it is closed); Ctx ends at Close.
	Go     func(fn func()) error
	Ctx    context.Context
	Logger *slog.Logger
	Now    func() time.Time

	TopicPrefix  string        // a job's topic is TopicPrefix + id
	Lease        time.Duration // how long a node's claim on a running job lasts unless renewed
	AbandonAfter time.Duration // a job nobody read for this long ends error abandoned
	Retention    time.Duration // a finished job is kept this long, then deleted
	Linger       time.Duration // the least time between two commits of the node's jobs' output (commit.go)
	MaxBuffer    int           // bytes of pending text that are committed at once
}

// Func is an upstream: it writes through w until it returns; its meta (if
// not nil) is the job's final metadata.
type Func func(ctx context.Context, w *Writer) (meta any, err error)

// Manager starts, runs and reads jobs.
type Manager struct {
	cfg  Config
	node string

	mu    sync.Mutex
	runs  map[string]*run  // jobs this node runs, by id
	open  map[string]int   // readers open on this node through the hub's handlers, by job id (readers.go)
	wrote map[string]int64 // when this node last wrote a job's lastRead (Unix ms), by id, for a tick

	wake, full chan struct{} // 1: wake the committer (commit.go)
}

// New returns a Manager of cfg; its committer (commit.go) and its count
// of the readers held open (readers.go) run on goroutines of cfg.Go until
// cfg.Ctx ends.
func New(cfg Config) *Manager {
	m := &Manager{cfg: cfg, node: uuid.NewString(), runs: make(map[string]*run),
		open: make(map[string]int), wrote: make(map[string]int64),
		wake: make(chan struct{}, 1), full: make(chan struct{}, 1)}
	_ = cfg.Go(m.commitLoop) // ErrClosed: the hub closed, nothing runs
	_ = cfg.Go(m.holdReads)
	return m
}

// Info is what a job's record says of it.
type Info struct {
	ID        string
	Topic     string // the job's stream: a topic of the log
	Status    Status
	Created   time.Time
	Updated   time.Time // the upstream's last sign of life
	Completed time.Time // zero until it ended
	TextLen   int64     // committed text, in UTF-16 code units
	Events    int64     // committed events
	Progress  json.RawMessage
	Meta      json.RawMessage
	Err       *ErrorInfo
}

// ErrNotFound is a read's or Get's of a job that does not exist (never
// started, or deleted after its retention).
var ErrNotFound = errors.New("replayd: jobs: job not found")

// ErrBadID is Start's for an id that cannot name a job.
var ErrBadID = errors.New("replayd: jobs: a job id is 1 to 200 bytes of UTF-8 without control characters")

func validID(id string) bool {
	if id == "" || len(id) > 200 || !utf8.ValidString(id) {
		return false
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func (m *Manager) topic(id string) string { return m.cfg.TopicPrefix + id }

// Topic is the topic of job id's stream.
func (m *Manager) Topic(id string) string { return m.topic(id) }

// update runs fn in one stream transaction of topic and delivers what it
// appended once it committed.
func (m *Manager) update(ctx context.Context, topic string, fn func(a *durable.AppTx) error) error {
	return m.updateTopics(ctx, []string{topic}, fn)
}

// Start starts job id (a fresh UUIDv7 when id is ""), running fn on this
// node, unless a job of that id exists: then it returns that job's Info
// and started false, and fn never runs. The job's record is created in one
// store transaction, serialised per id over every node sharing the store,
// so of any number of concurrent starts of one id exactly one runs fn.
func (m *Manager) Start(ctx context.Context, id string, fn Func) (Info, bool, error) {
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return Info{}, false, err
		}
		id = u.String()
	}
	if !validID(id) {
		return Info{}, false, ErrBadID
	}
	topic := m.topic(id)
	var rec *record
	var created bool
	create := func(a *durable.AppTx) error {
		rec, created = nil, false
		s, err := a.Get(ctx, topic)
		if err != nil {
			return err
		}
		if s != nil {
			rec, err = decodeRecord(s.App)
			return err
		}
		now := a.Now()
		r := &record{ID: id, Status: Streaming, Owner: m.node, Lease: now + m.cfg.Lease.Milliseconds(),
			Created: now, Updated: now, LastRead: now}
		if err := a.Create(ctx, topic, r.encode(), m.expiry(r)); err != nil {
			return err
		}
		rec, created = r, true
		return nil
	}
	err := m.update(ctx, topic, create)
	if errors.Is(err, durable.ErrExpired) {
		if err = m.cfg.Sweeper.BuryExpired(ctx, topic); err == nil {
			err = m.update(ctx, topic, create)
		}
	}
	if err != nil {
		return Info{}, false, err
	}
	if !created {
		rec, err = m.settle(ctx, topic, rec)
		if err != nil {
			return Info{}, false, err
		}
		return m.info(rec), false, nil
	}
	m.run(id, topic, rec, fn)
	return m.info(rec), true, nil
}

// expiry is when a job's stream expires: Retention after it ended, or,
// while it streams, Retention after its lease lapses (so that a job whose
// node died and that nobody read is deleted in the end too).
func (m *Manager) expiry(r *record) int64 {
	if r.Status == Streaming {
		return r.Lease + m.cfg.Retention.Milliseconds()
	}
	return r.Completed + m.cfg.Retention.Milliseconds()
}

func (m *Manager) info(r *record) Info {
	in := Info{ID: r.ID, Topic: m.topic(r.ID), Status: r.Status, Created: time.UnixMilli(r.Created),
		Updated: time.UnixMilli(r.Updated), TextLen: r.Text, Events: r.Events,
		Progress: r.Progress, Meta: r.Meta, Err: r.Err}
	if r.Completed > 0 {
		in.Completed = time.UnixMilli(r.Completed)
	}
	return in
}

// Get returns job id's Info (ErrNotFound when there is none). Reading a
// job whose node's lease lapsed ends it error interrupted first.
func (m *Manager) Get(ctx context.Context, id string) (Info, error) {
	rec, err := m.load(ctx, id)
	if err != nil {
		return Info{}, err
	}
	return m.info(rec), nil
}

// load reads job id's record, settled.
func (m *Manager) load(ctx context.Context, id string) (*record, error) {
	if !validID(id) {
		return nil, ErrNotFound
	}
	topic := m.topic(id)
	page, err := m.cfg.Store.ReadStream(ctx, storage.StreamReadRequest{Topic: topic, Limit: 1, MaxBytes: 1})
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
	return m.settle(ctx, topic, rec)
}

// settle ends rec error interrupted if it is streaming and its lease
// lapsed (the node running it died, or lost the store), and returns the
// record as it then is.
func (m *Manager) settle(ctx context.Context, topic string, rec *record) (*record, error) {
	if rec.Status != Streaming || rec.Lease >= m.cfg.Now().UnixMilli() {
		return rec, nil
	}
	var out *record
	err := m.update(ctx, topic, func(a *durable.AppTx) error {
		out = nil
		s, err := a.Get(ctx, topic)
		if err != nil || s == nil {
			return err
		}
		cur, err := decodeRecord(s.App)
		if err != nil {
			return err
		}
		if cur.Status != Streaming || cur.Lease >= a.Now() {
			out = cur
			return nil
		}
		out = cur
		return m.finish(ctx, a, topic, cur, outcome{status: Error,
			err: &ErrorInfo{Code: CodeInterrupted, Message: "the node running the job stopped before it ended"}})
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, ErrNotFound
	}
	return out, nil
}

// outcome is how a job ends.
type outcome struct {
	status Status
	meta   json.RawMessage
	err    *ErrorInfo
}

// finish ends cur in a: the end message, the record, the stream closed,
// expiring Retention later.
func (m *Manager) finish(ctx context.Context, a *durable.AppTx, topic string, cur *record, o outcome) error {
	now := a.Now()
	cur.Status, cur.Meta, cur.Err, cur.Owner, cur.Completed, cur.Updated = o.status, o.meta, o.err, "", now, now
	end := message{K: kindEnd, Status: o.status, Meta: o.meta, Err: o.err}
	if _, err := a.Append(ctx, topic, []json.RawMessage{end.encode()}); err != nil {
		return err
	}
	return a.Set(ctx, topic, cur.encode(), m.expiry(cur), true)
}

// touch records a read of job id at now: on this node's run at once, for
// a job another node runs in its record (at most once a quarter of
// AbandonAfter), so that the node running it does not abandon it.
func (m *Manager) touch(ctx context.Context, rec *record) {
	if rec.Status != Streaming {
		return
	}
	now := m.cfg.Now().UnixMilli()
	m.mu.Lock()
	r := m.runs[rec.ID]
	m.mu.Unlock()
	if r != nil {
		r.lastRead.Store(now)
		return
	}
	if now-rec.LastRead < m.cfg.AbandonAfter.Milliseconds()/4 {
		return
	}
	m.writeRead(ctx, rec.ID, now)
}

func errorf(code, format string, args ...any) *ErrorInfo {
	return &ErrorInfo{Code: code, Message: fmt.Sprintf(format, args...)}
}
