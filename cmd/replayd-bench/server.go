package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/replayd/replayd"
)

// The server role: one OS process serving SSE on 127.0.0.1, either a
// replayd hub ("hub") or the raw ceiling ("raw"), plus control endpoints
// under /ctl/ that the orchestrator calls to publish, measure throughput,
// start the tail and read the process's RSS and CPU. It prints its address
// on stdout, exits when its stdin closes (so it never outlives the
// orchestrator), and exits on its own after Deadline whatever happens.

// roleEnv names the child role; configEnv carries its JSON config.
const (
	roleEnv   = "REPLAYD_BENCH_ROLE"
	configEnv = "REPLAYD_BENCH_CONFIG"
)

type serverConfig struct {
	Mode        string        // "hub", "detach" (a hub with DetachConnections) or "raw"
	DB          string        // the hub's database file
	MaxBuffered int           // SSEOptions.MaxBufferedBytes
	Heartbeat   time.Duration // SSEOptions.HeartbeatInterval
	Deadline    time.Duration // hard limit on the process's life
}

// runChild runs the role named by the environment, if any, and reports
// whether it did; the caller then exits with code.
func runChild() (code int, ran bool) {
	switch os.Getenv(roleEnv) {
	case "server":
	case clientRole:
		return runClientRole(), true
	default:
		return 0, false
	}
	var cfg serverConfig
	if err := json.Unmarshal([]byte(os.Getenv(configEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "replayd-bench server: config:", err)
		return 2, true
	}
	if err := runServer(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "replayd-bench server:", err)
		return 1, true
	}
	return 0, true
}

type server struct {
	cfg serverConfig
	db  *sql.DB
	hub *replayd.EventHub
	raw *rawHub

	tailMu   sync.Mutex
	tailStop func()
}

func runServer(cfg serverConfig, stdin io.Reader, stdout io.Writer) error {
	raiseFileLimit()
	if os.Getenv("REPLAYD_BENCH_MEMPROFILE") == "1" {
		runtime.MemProfileRate = 1 // /ctl/heap sees every allocation
	}
	deadline := time.AfterFunc(cfg.Deadline, func() {
		fmt.Fprintln(os.Stderr, "replayd-bench server: deadline passed; exiting")
		os.Exit(3)
	})
	defer deadline.Stop()

	s := &server{cfg: cfg}
	mux := http.NewServeMux()
	switch cfg.Mode {
	case "hub", "detach":
		db, err := replayd.OpenDB(cfg.DB)
		if err != nil {
			return err
		}
		defer db.Close()
		hub, err := replayd.New(db, replayd.Options{SSE: replayd.SSEOptions{
			MaxBufferedBytes:  cfg.MaxBuffered,
			HeartbeatInterval: cfg.Heartbeat,
			DetachConnections: cfg.Mode == "detach",
		}})
		if err != nil {
			return err
		}
		defer hub.Close()
		s.db, s.hub = db, hub
		mux.Handle("/events", hub.Handler())
	case "raw":
		s.raw = newRawHub()
		defer s.raw.close()
		mux.Handle("/events", s.raw)
	default:
		return fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	mux.HandleFunc("/ctl/stats", s.handleStats)
	mux.HandleFunc("/ctl/publish", s.handlePublish)
	mux.HandleFunc("/ctl/pubbench", s.handlePubBench)
	mux.HandleFunc("/ctl/rawinsert", s.handleRawInsert)
	mux.HandleFunc("/ctl/tail", s.handleTail)
	mux.Handle("/ctl/heap", pprof.Handler("heap")) // ?gc=1 collects first
	s.registerExtra(mux)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// The hub is closed before Shutdown (below): Shutdown does not wait for
	// detached streams, and Close ends them.
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "ADDR %s\n", ln.Addr())

	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(stdinClosed)
	}()
	select {
	case <-stdinClosed:
	case err := <-served:
		return err
	}
	if s.hub != nil {
		s.hub.Close() // ends every stream
	}
	if s.raw != nil {
		s.raw.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
	return nil
}

// selfStats is this process's procStats (Clients unset); gcs > 0 first
// runs that many collections (each may halve an idle goroutine's stack),
// then FreeOSMemory (one more).
func selfStats(gcs int) procStats {
	if gcs > 0 {
		for range gcs {
			runtime.GC()
		}
		debug.FreeOSMemory()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	user, sys := cpuTimes()
	return procStats{
		RSSKiB:     rssKiB(),
		CPUNanos:   int64(user + sys),
		SysNanos:   int64(sys),
		Goroutines: runtime.NumGoroutine(),
		HeapInuse:  int64(ms.HeapInuse),
		StackInuse: int64(ms.StackInuse),
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func queryInt(r *http.Request, name string, def int) int {
	if v, err := strconv.Atoi(r.URL.Query().Get(name)); err == nil {
		return v
	}
	return def
}

func queryDur(r *http.Request, name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(r.URL.Query().Get(name)); err == nil {
		return v
	}
	return def
}

// handleStats reports RSS, CPU and goroutines; ?gc=n first runs n GCs and
// returns freed memory to the OS.
func (s *server) handleStats(w http.ResponseWriter, r *http.Request) {
	st := selfStats(queryInt(r, "gc", 0))
	if s.hub != nil {
		for _, t := range s.hub.Clients().Snapshot() {
			st.Clients += t.ActiveClients
		}
	} else if s.raw != nil {
		st.Clients = s.raw.count()
	}
	writeJSON(w, st)
}

// publishResult is what /ctl/publish answers.
type publishResult struct {
	StartNanos int64  `json:"startNanos"` // wall clock, unix ns
	EndNanos   int64  `json:"endNanos"`
	Published  int64  `json:"published"`
	Errors     int64  `json:"errors"`
	FirstErr   string `json:"firstErr,omitempty"`
}

// stampedPayload is a ~200-byte JSON payload whose "t" is the wall clock
// (unix ns) when the publish started; clients measure latency from it.
func stampedPayload(buf []byte) []byte {
	buf = append(buf[:0], `{"t":`...)
	buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
	buf = append(buf, `,"kind":"order.updated","order":{"id":"ord_5f2a9c1e","status":"shipped","items":3},"note":"`...)
	buf = append(buf, padding...)
	return append(buf, `"}`...)
}

var padding = strings.Repeat("x", 84)

// handlePublish publishes n events to topic on conc goroutines, at rate
// events/s (0: as fast as they go), and answers when all are published.
// With topics=T > 1 the events go round-robin to topic-0 … topic-(T-1)
// (event i to topic-(i mod T)) instead of topic.
func (s *server) handlePublish(w http.ResponseWriter, r *http.Request) {
	n := int64(queryInt(r, "n", 1))
	rate := queryInt(r, "rate", 0)
	conc := max(1, queryInt(r, "conc", 1))
	names := []string{r.URL.Query().Get("topic")}
	if t := queryInt(r, "topics", 1); t > 1 {
		names = make([]string, t)
		for k := range names {
			names[k] = fmt.Sprintf("%s-%d", r.URL.Query().Get("topic"), k)
		}
	}
	ctx := r.Context()

	var publish func(topic string, payload []byte) error
	if s.hub != nil {
		publish = func(topic string, p []byte) error {
			_, err := s.hub.Publish(ctx, topic, json.RawMessage(p))
			return err
		}
	} else {
		publish = func(topic string, p []byte) error { s.raw.publish(topic, p); return nil }
	}
	var res publishResult
	var published, failed atomic.Int64
	var errOnce sync.Once
	tokens := make(chan string, 1024) // each event's topic
	start := time.Now()
	res.StartNanos = start.UnixNano()
	go func() {
		defer close(tokens)
		var interval time.Duration
		if rate > 0 {
			interval = time.Second / time.Duration(rate)
		}
		for i := range n {
			if interval > 0 {
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d)
				}
			}
			select {
			case tokens <- names[i%int64(len(names))]:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for topic := range tokens {
				buf = stampedPayload(buf)
				if err := publish(topic, buf); err != nil {
					failed.Add(1)
					errOnce.Do(func() { res.FirstErr = err.Error() })
					continue
				}
				published.Add(1)
			}
		}()
	}
	wg.Wait()
	res.EndNanos = time.Now().UnixNano()
	res.Published, res.Errors = published.Load(), failed.Load()
	writeJSON(w, res)
}

// rateResult is a throughput measurement.
type rateResult struct {
	Events  int64   `json:"events"`
	Seconds float64 `json:"seconds"`
	Err     string  `json:"err,omitempty"`
}

func (r rateResult) perSecond() float64 {
	if r.Seconds <= 0 {
		return 0
	}
	return float64(r.Events) / r.Seconds
}

// handlePubBench runs conc goroutines calling Publish for dur.
func (s *server) handlePubBench(w http.ResponseWriter, r *http.Request) {
	if s.hub == nil {
		http.Error(w, "no hub", http.StatusBadRequest)
		return
	}
	conc := max(1, queryInt(r, "conc", 1))
	dur := queryDur(r, "dur", time.Second)
	payload := stampedPayload(nil)
	var n atomic.Int64
	var errOnce sync.Once
	var res rateResult
	start := time.Now()
	stop := start.Add(dur)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if _, err := s.hub.Publish(r.Context(), "bench", json.RawMessage(payload)); err != nil {
					errOnce.Do(func() { res.Err = err.Error() })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	res.Events, res.Seconds = n.Load(), time.Since(start).Seconds()
	writeJSON(w, res)
}

// handleRawInsert is the raw SQLite baseline: for dur, a loop of INSERTs
// with rows rows per transaction on one connection of a second database
// file opened with OpenDB (same pragmas) and the hub's schema.
func (s *server) handleRawInsert(w http.ResponseWriter, r *http.Request) {
	rows := max(1, queryInt(r, "rows", 1))
	dur := queryDur(r, "dur", time.Second)
	res, err := rawInsert(r.Context(), s.cfg.DB+fmt.Sprintf(".raw%d", rows), rows, dur)
	if err != nil {
		res.Err = err.Error()
	}
	writeJSON(w, res)
}

func rawInsert(ctx context.Context, path string, rows int, dur time.Duration) (rateResult, error) {
	var res rateResult
	db, err := replayd.OpenDB(path)
	if err != nil {
		return res, err
	}
	defer db.Close()
	hub, err := replayd.New(db, replayd.Options{}) // creates the schema
	if err != nil {
		return res, err
	}
	hub.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return res, err
	}
	defer conn.Close()
	ins, err := conn.PrepareContext(ctx, `INSERT INTO events (event_id, type, topic, payload, created_at) VALUES (?, ?, ?, ?, ?)`)
	if err != nil {
		return res, err
	}
	defer ins.Close()
	payload := string(stampedPayload(nil))
	start := time.Now()
	stop := start.Add(dur)
	for time.Now().Before(stop) {
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return res, err
		}
		now := time.Now().UnixMilli()
		for range rows {
			id, err := uuid.NewV7()
			if err != nil {
				return res, err
			}
			if _, err := ins.ExecContext(ctx, id.String(), "message", "bench", payload, now); err != nil {
				return res, err
			}
		}
		if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
			return res, err
		}
		res.Events += int64(rows)
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// handleTail starts the hub's tail (?interval=&max=), or stops it (?stop=1).
func (s *server) handleTail(w http.ResponseWriter, r *http.Request) {
	if s.hub == nil {
		http.Error(w, "no hub", http.StatusBadRequest)
		return
	}
	s.tailMu.Lock()
	defer s.tailMu.Unlock()
	if r.URL.Query().Get("stop") == "1" {
		if s.tailStop != nil {
			s.tailStop()
			s.tailStop = nil
		}
		writeJSON(w, struct{}{})
		return
	}
	stop, err := s.hub.StartTail(queryDur(r, "interval", 0), replayd.TailOptions{MaxInterval: queryDur(r, "max", 0)})
	if err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	s.tailStop = stop
	writeJSON(w, struct{}{})
}

// serverProc is a running server child, seen from the orchestrator.
type serverProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	addr   string
	stderr *tailBuffer
	waited chan error
	client *http.Client
}

// startServer spawns this executable in the server role and waits for its
// address.
func startServer(ctx context.Context, cfg serverConfig) (*serverProc, error) {
	ch, err := startChild("server", cfg)
	if err != nil {
		return nil, err
	}
	cmd, stdout := ch.cmd, ch.stdout
	p := &serverProc{cmd: cmd, stdin: ch.stdin, stderr: ch.stderr, waited: make(chan error, 1)}
	go func() { p.waited <- cmd.Wait() }()
	addrc := make(chan string, 1)
	go func() {
		br := bufio.NewReader(stdout)
		line, _ := br.ReadString('\n')
		addrc <- strings.TrimSpace(strings.TrimPrefix(line, "ADDR "))
		_, _ = io.Copy(io.Discard, br)
	}()
	select {
	case p.addr = <-addrc:
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
	if p.addr == "" {
		p.stop()
		return nil, fmt.Errorf("server did not start: %s", p.stderr)
	}
	p.client = &http.Client{Transport: &http.Transport{}}
	return p, nil
}

// ctl calls a control endpoint and decodes its JSON answer into out.
func (p *serverProc) ctl(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (p *serverProc) stats(ctx context.Context, gc bool) (procStats, error) {
	n := 0
	if gc {
		n = 1
	}
	return p.statsGC(ctx, n)
}

// statsGC reads the stats after n GCs and FreeOSMemory (none if n is 0).
func (p *serverProc) statsGC(ctx context.Context, n int) (procStats, error) {
	var st procStats
	path := "/ctl/stats"
	if n > 0 {
		path += "?gc=" + strconv.Itoa(n)
	}
	err := p.ctl(ctx, path, &st)
	return st, err
}

// stop closes the child's stdin, which makes it shut down, and kills it if
// it has not exited within 5s.
func (p *serverProc) stop() {
	p.stdin.Close()
	if p.client != nil {
		p.client.CloseIdleConnections()
	}
	select {
	case <-p.waited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.waited
	}
}

// tailBuffer keeps the last max bytes written to it.
// child is a started process of this executable in a role (roleEnv),
// with its config as JSON in configEnv, its stdin and stdout piped and the
// end of its stderr kept.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr *tailBuffer
}

// startChild starts this executable in role with cfg.
func startChild(role string, cfg any) (*child, error) {
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	c := &child{cmd: exec.Command(exe), stderr: &tailBuffer{max: 8 << 10}}
	c.cmd.Env = append(os.Environ(), roleEnv+"="+role, configEnv+"="+string(js))
	c.cmd.Stderr = c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if c.stdout, err = c.cmd.StdoutPipe(); err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
