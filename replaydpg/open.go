package replaydpg

// Open and its options, the Store type with its statements (queries,
// rendered once for the table prefix), and Close.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/replayd/replayd/storage"
)

// ErrClosed is returned by a Store's methods after Close.
var ErrClosed = errors.New("replaydpg: store is closed")

// DefaultPrefix is the table prefix when Open gets no WithTablePrefix.
const DefaultPrefix = "replayd_"

// Option configures Open.
type Option func(*config)

type config struct {
	prefix    string
	listenDSN string
	txPooling bool
}

// WithListenDSN connects the listener (the one session-level connection
// behind WaitForAppend, which LISTENs) to listenDSN instead of Open's dsn:
// to PostgreSQL directly, or through a pooler in session mode, when Open's
// dsn goes through a pooler in transaction mode. Both must reach the same
// database.
func WithListenDSN(listenDSN string) Option {
	return func(c *config) { c.listenDSN = listenDSN }
}

// WithTransactionPooling declares that Open's dsn goes through a pooler in
// transaction mode (PgBouncer pool_mode = transaction), where consecutive
// transactions of one client connection may run on different server
// connections. The pool then runs every statement unnamed (pgx's
// QueryExecModeExec: nothing prepared outlives its pipeline; PgBouncer
// before 1.21 supports no prepared statements in this mode) unless the dsn
// sets default_query_exec_mode, and sets no session parameter. It requires
// WithListenDSN, since LISTEN is session state: through a transaction-mode
// pooler notifications would go to whichever client holds the server
// connection next.
func WithTransactionPooling() Option {
	return func(c *config) { c.txPooling = true }
}

// WithTablePrefix names the tables prefix+"events", prefix+"head",
// prefix+"watermarks", prefix+"skips" and prefix+"outbox", the NOTIFY
// channel prefix+"events", and the relay's advisory lock. The prefix is
// lower-case ASCII letters, digits and underscores, starting with a letter or
// underscore, at most 40 bytes; Open refuses anything else. Stores with
// different prefixes in one database are independent logs.
func WithTablePrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

var prefixRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// Store is a replayd log in PostgreSQL. It is safe for concurrent use by any
// number of goroutines, and any number of Stores (in any number of
// processes) may share one database and prefix.
type Store struct {
	pool    *pgxpool.Pool
	connCfg *pgx.ConnConfig // for the listener's own connection
	prefix  string
	channel string
	q       queries

	noNotify    bool // benchmarks only: measures what the NOTIFY costs
	dedupAlways bool // benchmarks only: every Append looks each event id up (qAppendDedup)

	ctx    context.Context // ended by Close
	cancel context.CancelFunc

	probe chan struct{} // holds a token while a ProbeWrite runs

	listenOnce sync.Once
	listenDone chan struct{} // closed when the listener goroutine exits

	relayKick chan struct{} // holds a token when the relay has transactions to watch
	relayDone chan struct{} // closed when the relay goroutine exits
	watchMu   sync.Mutex    // guards watching
	watching  []string      // ids of transactions that published (PublishTx), for the relay to watch

	// issued is the highest sequence this store knows its log issued: its
	// appends', every head it read or heard of. Every append raises the
	// floor if the head is below it (see floorGuard in append.go).
	issued atomic.Int64

	mu      sync.Mutex    // guards known, changed and closed
	known   int64         // the highest head the listener has heard of
	changed chan struct{} // closed and replaced whenever known may have moved
	closed  bool
}

// Store keeps replayd's storage contract (the storetest kit checks it) and
// wakes a tailing hub through LISTEN/NOTIFY.
var (
	_ storage.Store         = (*Store)(nil)
	_ storage.Notifier      = (*Store)(nil)
	_ storage.SchemaEnsurer = (*Store)(nil)
	_ storage.WriteProber   = (*Store)(nil)
)

// queries are a Store's statements, rendered for its table prefix once, at
// Open. Each statement's text (its q constant, written with %[1]s for the
// prefix) lives beside the code that runs it, with the reasons for its
// shape; this is their index. A statement that names no table needs no
// rendering: qTxStatus is held here as it is, and qProbe, qRelayLock, qStreamLock,
// qBeginSnapshot and qSchemaColumns are run as they are; ensureSchema
// renders the schema's DDL itself.
type queries struct {
	lock, appendNew, appendDedup                         string // append.go (lock: probe.go too)
	headRow, highest, insertHead, repairHead, skip, jump string // floor.go
	head, headForeign, watermark                         string // query.go
	oldestGlobal, oldestTopics, pageGlobal, pageTopics   string
	newestSeqGlobal, newestSeqTopics                     string
	countGlobal, countTopics                             string
	pruneEdges, pruneBatch                               string // prune.go
	prune                                                topicPruneQueries
	txPublish, txStored                                  string // outbox.go
	txStatus, outboxAny, outboxTake, outboxDelete        string // relay.go
	streamGet, streamsGet, streamPut, streamDelete       string // streams.go
	producerGet, producerPut                             string
	streamWatermark, streamLast, streamAt, streamPage    string
}

// newQueries renders the statements for the table prefix p.
func newQueries(p string) queries {
	return queries{
		lock: render(qLock, p), appendNew: render(qAppendNew, p), appendDedup: render(qAppendDedup, p),
		head: render(qHead, p), watermark: render(qWatermark, p),
		headForeign: render(qHeadForeign, p), headRow: render(qHeadRow, p), highest: render(qHighest, p),
		insertHead: render(qInsertHead, p), repairHead: render(qRepairHead, p), skip: render(qSkip, p), jump: render(qJump, p),
		newestSeqGlobal: render(qNewestSeqGlobal, p), newestSeqTopics: render(qNewestSeqTopics, p),
		oldestGlobal: render(qOldestGlobal, p), oldestTopics: render(qOldestTopics, p),
		pageGlobal: render(qPageGlobal, p), pageTopics: render(qPageTopics, p),
		countGlobal: render(qCountGlobal, p), countTopics: render(qCountTopics, p),
		pruneEdges: render(qPruneEdges, p), pruneBatch: render(qPruneBatch, p), prune: newTopicPruneQueries(p),
		txPublish: render(qTxPublish, p), txStored: render(qTxStored, p), outboxAny: render(qOutboxAny, p),
		outboxTake: render(qOutboxTake, p), outboxDelete: render(qOutboxDelete, p), txStatus: qTxStatus,
		streamGet: render(qStreamGet, p), streamsGet: render(qStreamsGet, p), streamPut: render(qStreamPut, p), streamDelete: render(qStreamDelete, p),
		producerGet: render(qProducerGet, p), producerPut: render(qProducerPut, p),
		streamWatermark: render(qStreamWatermark, p), streamLast: render(qStreamLast, p),
		streamAt: render(qStreamAt, p), streamPage: render(qStreamPage, p),
	}
}

// render substitutes the table prefix into a query.
func render(q, prefix string) string {
	return strings.ReplaceAll(q, "%[1]s", prefix)
}

// Open connects to dsn (a pgx connection string or URL), creates the schema
// if it is missing, and returns a Store owning a pgxpool. Any number of
// processes may Open the same database at once.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	cfg := config{prefix: DefaultPrefix}
	for _, o := range opts {
		o(&cfg)
	}
	if !prefixRE.MatchString(cfg.prefix) {
		return nil, fmt.Errorf("replaydpg: %w: table prefix %q: want [a-z_][a-z0-9_]{0,39}", storage.ErrInvalid, cfg.prefix)
	}
	if cfg.txPooling && cfg.listenDSN == "" {
		return nil, fmt.Errorf("replaydpg: %w: WithTransactionPooling needs WithListenDSN: LISTEN needs a session-level connection", storage.ErrInvalid)
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("replaydpg: open: %w", err)
	}
	listenCfg := pcfg.ConnConfig.Copy()
	if cfg.listenDSN != "" {
		// Parsed as a pool's DSN, so that one may be given for the other.
		lcfg, err := pgxpool.ParseConfig(cfg.listenDSN)
		if err != nil {
			return nil, fmt.Errorf("replaydpg: open: listen DSN: %w", err)
		}
		listenCfg = lcfg.ConnConfig
	}
	if cfg.txPooling {
		if !dsnSets(dsn, "default_query_exec_mode") {
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		}
	} else {
		// SETs, not startup parameters: PgBouncer refuses unknown startup
		// parameters.
		var sets []string
		if _, ok := pcfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !ok {
			// Every query's plan is fixed by its text (see schema.go and
			// query.go): plan once per connection, not once per call. Planning the append
			// statement costs about as much as running it for one event.
			sets = append(sets, "SET plan_cache_mode = force_generic_plan")
		}
		if _, ok := pcfg.ConnConfig.RuntimeParams["jit"]; !ok {
			// A generic plan's LIMIT $n is costed as a tenth of the table:
			// on a big log that passes jit_above_cost, and compiling took
			// 3-7 ms per read for reads that run in 0.2 ms (TestNoJIT).
			sets = append(sets, "SET jit = off")
		}
		if _, ok := pcfg.ConnConfig.RuntimeParams["synchronous_commit"]; !ok {
			// Publish returns once the commit is durable: a
			// server or role running with synchronous_commit = off would
			// acknowledge events a crash then loses. Only off is raised;
			// local, remote_write, on and remote_apply are durable here and
			// stay as the administrator set them.
			sets = append(sets, "SELECT set_config('synchronous_commit', 'on', false) WHERE current_setting('synchronous_commit') = 'off'")
		}
		if len(sets) > 0 {
			pcfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				for _, set := range sets {
					if _, err := conn.Exec(ctx, set); err != nil {
						return err
					}
				}
				return nil
			}
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("replaydpg: open: %w", err)
	}
	p := cfg.prefix
	s := &Store{
		pool:       pool,
		connCfg:    listenCfg,
		prefix:     p,
		channel:    p + "events",
		listenDone: make(chan struct{}),
		changed:    make(chan struct{}),
		probe:      make(chan struct{}, 1),
		q:          newQueries(p),
		relayKick:  make(chan struct{}, 1),
		relayDone:  make(chan struct{}),
	}
	// Name the listener's session, for pg_stat_activity.
	name := "replayd listener"
	if app := s.connCfg.RuntimeParams["application_name"]; app != "" {
		name = app + " (" + name + ")"
	}
	s.connCfg.RuntimeParams["application_name"] = name
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.ensureSchema(ctx, true); err != nil {
		s.cancel()
		pool.Close()
		return nil, fmt.Errorf("replaydpg: open: %w", err)
	}
	go s.relay()
	return s, nil
}

// dsnSets reports whether dsn (already parsed once without error) sets
// the parameter key.
func dsnSets(dsn, key string) bool {
	c, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return false
	}
	_, ok := c.RuntimeParams[key]
	return ok
}

// Close stops the listener, if any, and the relay, and closes the pool. Calls in progress
// may fail; later calls return ErrClosed. It is safe to call more than once.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.listenOnce.Do(func() { close(s.listenDone) }) // never started: nothing to wait for
	<-s.listenDone
	<-s.relayDone
	s.pool.Close()
	return nil
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
