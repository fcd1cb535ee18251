package replaydredis

// Open and its options, the Store type, and Close.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/replayd/replayd/storage"
)

// ErrClosed is returned by a Store's methods after Close.
var ErrClosed = errors.New("replaydredis: store is closed")

// DefaultPrefix is the key prefix when Open gets no WithPrefix.
const DefaultPrefix = "replayd"

// Option configures Open.
type Option func(*config)

type config struct {
	prefix string
	logger *slog.Logger
}

// WithPrefix names the log's keys "{prefix}:head", "{prefix}:log" and so
// on (see the package doc). The prefix is ASCII letters, digits, '_', '-',
// '.' and ':', 1 to 64 bytes; Open refuses anything else. Stores with
// different prefixes on one Redis are independent logs.
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithLogger sets where the store logs a raised sequence floor (a Redis
// restart, a replaced log); slog.Default() by default.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// Store is a replayd log in Redis. It is safe for concurrent use by any
// number of goroutines, and any number of Stores (in any number of
// processes) may share one Redis and prefix.
type Store struct {
	c      *redis.Client // appends and reads
	lc     *redis.Client // the listener's one connection (notify.go)
	prefix string
	p      string // the keys' prefix, "{prefix}:"
	logger *slog.Logger

	// issued is the highest sequence this store knows its log issued: its
	// appends', every head it read. The append script raises the floor if
	// the head is below it (append.go).
	issued atomic.Int64

	ctx    context.Context // ended by Close
	cancel context.CancelFunc

	listenOnce sync.Once
	listenDone chan struct{} // closed when the listener goroutine exits

	mu      sync.Mutex    // guards known, changed and closed
	known   int64         // the head the listener last read
	changed chan struct{} // closed and replaced whenever known moves
	closed  bool
}

// Store keeps replayd's storage contract (the storetest kit checks it) and
// wakes a tailing hub through a blocking XREAD.
var (
	_ storage.Store       = (*Store)(nil)
	_ storage.Notifier    = (*Store)(nil)
	_ storage.Counter     = (*Store)(nil)
	_ storage.WriteProber = (*Store)(nil)
	_ storage.PoolSizer   = (*Store)(nil)
)

// PoolSize is the size of the pool of connections the store's appends and
// reads share (go-redis's PoolSize; the listener has one of its own): the
// hub keeps its concurrent replay reads two below it (see
// storage.PoolSizer), so that a storm of handshakes waits in the hub, not
// in the pool, where a wait beyond go-redis's PoolTimeout fails the read.
func (s *Store) PoolSize() int { return s.c.Options().PoolSize }

// Open connects to the Redis of url (redis://[user:password@]host:port[/db],
// or rediss:// for TLS; see redis.ParseURL), raises the log's sequence
// floor, and returns a Store owning two go-redis clients. Any number of
// processes may Open the same log at once.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("replaydredis: open: %w", err)
	}
	return OpenOptions(ctx, o, opts...)
}

// OpenOptions is Open with go-redis options. The store sets, on a copy,
// OnConnect (the log identity check), MaxRetries (none: see the package
// doc, "Errors and unknown outcomes"), ContextTimeoutEnabled, and
// Protocol 2 with no client-side caching.
func OpenOptions(ctx context.Context, o *redis.Options, opts ...Option) (*Store, error) {
	cfg := config{prefix: DefaultPrefix, logger: slog.Default()}
	for _, opt := range opts {
		opt(&cfg)
	}
	if !prefixRE.MatchString(cfg.prefix) {
		return nil, fmt.Errorf("replaydredis: %w: key prefix %q: want [A-Za-z0-9_.:-]{1,64}", storage.ErrInvalid, cfg.prefix)
	}
	s := &Store{
		prefix:     cfg.prefix,
		p:          "{" + cfg.prefix + "}:",
		logger:     cfg.logger,
		listenDone: make(chan struct{}),
		changed:    make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	mk := func(poolSize int) *redis.Client {
		c := *o
		c.OnConnect = s.checkIdentity
		c.MaxRetries = -1
		c.ContextTimeoutEnabled = true
		c.Protocol = 2
		c.DisableIdentity = true
		if poolSize > 0 {
			c.PoolSize = poolSize
		}
		return redis.NewClient(&c)
	}
	s.c, s.lc = mk(0), mk(1)
	h, err := openScript.Run(ctx, s.c, nil, s.p).Int64()
	if err != nil {
		s.cancel()
		s.c.Close()
		s.lc.Close()
		return nil, fmt.Errorf("replaydredis: open: %w", err)
	}
	s.saw(h)
	return s, nil
}

// Close stops the listener, if any, and closes the clients. Calls in
// progress may fail; later calls return ErrClosed. It is safe to call more
// than once.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.changed) // wakes every WaitForAppend, which then sees closed
	s.mu.Unlock()
	s.cancel()
	s.listenOnce.Do(func() { close(s.listenDone) }) // never started: nothing to wait for
	err := s.lc.Close()                             // ends the listener's blocking XREAD
	<-s.listenDone
	return errors.Join(err, s.c.Close())
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// outcome classifies the error of a script that writes: a reply of Redis
// (the script did not run, or refused before writing) or a failure to dial
// stored nothing; anything else (a broken connection, an ended ctx after
// the script was sent) may have stored it all, and wraps
// storage.ErrOutcomeUnknown.
func outcome(err error) error {
	var re redis.Error
	if errors.As(err, &re) {
		return err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return err
	}
	return fmt.Errorf("%w: %w", storage.ErrOutcomeUnknown, err)
}
