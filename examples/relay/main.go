// Command relay is a resumable stream relay built on replayd: a slow
// upstream (here a simulated language model writing a long answer) is
// written to the log chunk by chunk, and pages follow the answer through the
// browser module. Reload the page mid-answer and the text continues with
// nothing lost and nothing twice; open the same job in a second tab and it
// gets the same text from the start.
//
// Run it with
//
//	go run ./examples/relay
//
// and open http://127.0.0.1:8081/ (-addr changes the address). The database
// lives in a temporary directory removed at exit, unless -db names a file.
//
// Endpoints:
//
//	GET  /            the page (index.html, embedded)
//	GET  /replayd.js  the browser module (replayd.ClientScript)
//	GET  /events      the SSE endpoint, ?topic=job-<id>
//	GET  /poll        the poll endpoint, ?topic=job-<id>&cursor=n&wait=25
//	POST /jobs        start a job: {"id": "<id>", "topic": "job-<id>"}
//
// Each job publishes its chunks to its own topic, job-<id>, as events of
// type "chunk" ({"i": n, "text": "..."}), then one event of type "done".
//
// The page reads the answer over long polls (transport "poll"), the way a
// browser extension or an embedded frame that cannot hold a stream open
// would; the SSE endpoint is served too, and shares the poll's cursor.
package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/replayd/replayd"
)

//go:embed index.html
var indexHTML []byte

// replayLimit is how many events a reconnecting stream is replayed. A job
// writes about 300 chunks, so a page that opens or reloads at any point of
// an answer is replayed the whole of it, never given a gap.
const replayLimit = 1000

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "address to listen on")
	dbPath := flag.String("db", "", "SQLite file for the event log (default: a temporary file removed at exit)")
	chunks := flag.Int("chunks", 300, "chunks per answer")
	every := flag.Duration("every", 65*time.Millisecond, "time between chunks")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger, *addr, *dbPath, upstream{chunks: *chunks, every: *every}); err != nil {
		logger.Error("relay", "err", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, logger *slog.Logger, addr, dbPath string, up upstream) error {
	if dbPath == "" {
		dir, err := os.MkdirTemp("", "replayd-relay-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dbPath = filepath.Join(dir, "events.db")
	}
	db, err := replayd.OpenDB(dbPath)
	if err != nil {
		return err
	}
	defer db.Close()
	hub, err := replayd.New(db, replayd.Options{
		Logger: logger,
		SSE:    replayd.SSEOptions{ReplayLimit: replayLimit, Retry: time.Second},
	})
	if err != nil {
		return err
	}
	defer hub.Close() // runs before db.Close

	r := &relay{hub: hub, logger: logger, up: up}
	r.ctx, r.cancel = context.WithCancel(ctx)
	defer r.wait()
	defer r.cancel()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newMux(r), ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("relay: open this in a browser", "url", "http://"+ln.Addr().String()+"/", "db", dbPath)

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	r.cancel()
	hub.Close() // ends every stream, so Shutdown need not wait for them
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutCtx); serr != nil && err == nil {
		err = serr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// newMux routes the page, the module, the stream and the jobs.
func newMux(r *relay) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(indexHTML)
	})
	mux.Handle("/replayd.js", replayd.ClientScript())
	mux.Handle("/events", r.hub.Handler())
	mux.Handle("/poll", r.hub.PollHandler())
	mux.HandleFunc("POST /jobs", r.start)
	return mux
}

// relay starts jobs and owns their goroutines.
type relay struct {
	hub    *replayd.EventHub
	logger *slog.Logger
	up     upstream

	ctx    context.Context // ends the jobs
	cancel context.CancelFunc
	jobs   sync.WaitGroup // one per running job
}

// start answers POST /jobs: a new job id, whose answer is published to
// topic job-<id> by a goroutine that outlives the request.
func (r *relay) start(w http.ResponseWriter, _ *http.Request) {
	var b [8]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	r.jobs.Go(func() {
		if err := r.up.write(r.ctx, r.hub, id); err != nil && r.ctx.Err() == nil {
			r.logger.Warn("relay: job failed", "job", id, "err", err)
		}
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(map[string]string{"id": id, "topic": "job-" + id})
}

func (r *relay) wait() { r.jobs.Wait() }

// upstream simulates a slow producer: chunks pieces of text, one every
// every, like a language model streaming its answer.
type upstream struct {
	chunks int
	every  time.Duration
}

// write publishes the job's answer to its topic, then a "done" event. Each
// chunk has an event id derived from the job, so a retried publish stores
// it once.
func (u upstream) write(ctx context.Context, hub *replayd.EventHub, id string) error {
	topic := "job-" + id
	t := time.NewTicker(u.every)
	defer t.Stop()
	var total int
	for i := range u.chunks {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		text := chunkText(id, i)
		total += len(text)
		_, err := hub.Publish(ctx, topic, map[string]any{"i": i, "text": text},
			replayd.WithType("chunk"), replayd.WithEventID(fmt.Sprintf("%s/%d", id, i)))
		if err != nil {
			return err
		}
	}
	_, err := hub.Publish(ctx, topic, map[string]any{"chunks": u.chunks, "bytes": total},
		replayd.WithType("done"), replayd.WithEventID(id+"/done"))
	return err
}

var words = strings.Fields(`the log is the only shared state so a reload a redeploy or a
	second process loses nothing a page could resume from every chunk is a row and its
	sequence is the cursor naïve relays keep the answer in memory and lose it — replayd
	writes it down first then serves it to whoever asks ✓`)

// chunkText is chunk i of job id's answer: a few words, now and then the
// end of a sentence or of a paragraph. It depends only on its arguments.
func chunkText(id string, i int) string {
	n := int(id[i%len(id)]) + 7*i
	var text string
	for k := range 1 + n%3 {
		text += words[(n+5*k)%len(words)] + " "
	}
	switch {
	case i%41 == 40:
		return text + "\n\n"
	case i%9 == 8:
		return strings.TrimSuffix(text, " ") + ". "
	}
	return text
}
