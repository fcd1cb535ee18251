// Command relay is a resumable stream relay on replayd's job streams
// (docs/jobs.md): a slow upstream (here a simulated language model: a
// little progress, a tool call, then a long answer a token at a time) is
// run as a job, and pages follow its answer with the browser module's
// followJob. Reload the page mid-answer and the text continues with
// nothing lost and nothing twice; open the same job in a second tab and it
// gets the same text from the start. Jobs are started over the
// stream-relay wire protocol v2 (Jobs.RelayHandler), so a client written
// for stream-relay can start and poll them too.
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
//	GET  /                      the page (index.html, embedded)
//	GET  /replayd.js            the browser module (replayd.ClientScript), with followJob
//	POST /relay/streams         start a job: {"streamId"?: id, "payload"?: {"prompt": "..."}}
//	                            -> {"protocolVersion": 2, "streamId": id, "startedAt": ms}
//	GET  /relay/streams/{id}    a stream-relay poll: ?since=N&eventSince=M
//	GET  /events                the SSE endpoint, ?topic=jobs/<id>
//	GET  /poll                  the poll endpoint, ?topic=jobs/<id>&cursor=n&wait=25
//	GET  /v1/stream/jobs/<id>   the job as a Durable Stream (closed at its end)
//
// A job's topic, jobs/<id>, holds its messages (docs/jobs.md):
// {"k":"text","o":offset,"t":"..."}, {"k":"event","n":n,"e":{...}},
// {"k":"progress","p":{...}} and a last {"k":"end","status":...}. The
// page follows it over SSE, falling back to long polls; the Go client's
// client.Job follows it the same way (main_test.go).
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/replayd/replayd"
)

//go:embed index.html
var indexHTML []byte

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "address to listen on")
	dbPath := flag.String("db", "", "SQLite file for the event log (default: a temporary file removed at exit)")
	tokens := flag.Int("tokens", 400, "tokens per answer")
	every := flag.Duration("every", 50*time.Millisecond, "time between tokens")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger, *addr, *dbPath, upstream{tokens: *tokens, every: *every}); err != nil {
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
	hub, err := replayd.New(db, replayd.Options{Logger: logger, SSE: replayd.SSEOptions{Retry: time.Second}})
	if err != nil {
		return err
	}
	defer hub.Close() // runs before db.Close
	jobs, err := hub.Jobs(replayd.JobsOptions{})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newMux(hub, jobs, up), ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("relay: open this in a browser", "url", "http://"+ln.Addr().String()+"/", "db", dbPath)

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	// Close cancels the running upstreams and waits for them, and ends
	// every stream, so Shutdown need not wait for them. A job cut short
	// ends error interrupted once its lease lapses: a restart on the same
	// -db shows it so, never as streaming for ever.
	hub.Close()
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

// newMux routes the page, the module, the relay protocol and the hub's
// readers.
func newMux(hub *replayd.EventHub, jobs *replayd.Jobs, up upstream) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(indexHTML)
	})
	mux.Handle("/replayd.js", replayd.ClientScript())
	mux.Handle("/relay/", jobs.RelayHandler(replayd.JobsRelayOptions{
		Prefix: "/relay/",
		Upstream: func(_ *http.Request, payload json.RawMessage) replayd.JobFunc {
			var p struct {
				Prompt string `json:"prompt"`
			}
			json.Unmarshal(payload, &p) // a missing or odd payload: no prompt
			return up.job(p.Prompt)
		},
	}))
	mux.Handle("/events", hub.Handler())
	mux.Handle("/poll", hub.PollHandler())
	mux.Handle("/v1/stream/", hub.DurableStreams(replayd.DurableStreamsOptions{})) // reads only: writes are refused
	return mux
}

// upstream simulates a language model: tokens pieces of text, one every
// every, after a little retrieval.
type upstream struct {
	tokens int
	every  time.Duration
}

// job is the upstream's answer to prompt, as a job: progress, a tool
// call's events, the answer a token at a time (see answer), a usage
// event, and metadata. It stops when its context ends (the job abandoned,
// or the hub closing).
func (u upstream) job(prompt string) replayd.JobFunc {
	return func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		pause := func(d time.Duration) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
				return nil
			}
		}
		w.Progress(replayd.JobProgress{Phase: "retrieval", Message: "Searching the log…"})
		if err := w.Emit(map[string]any{"type": "tool.start", "name": "search", "query": prompt}); err != nil {
			return nil, err
		}
		if err := pause(10 * u.every); err != nil {
			return nil, err
		}
		if err := w.Emit(map[string]any{"type": "tool.end", "name": "search", "results": 3}); err != nil {
			return nil, err
		}
		w.Progress(replayd.JobProgress{Phase: "generation", Message: "Writing the answer…"})
		toks := answer(w.ID(), u.tokens)
		for i, tok := range toks {
			if err := pause(u.every); err != nil {
				return nil, err
			}
			if _, err := w.WriteString(tok); err != nil {
				return nil, err // the job ended: abandoned, or taken over
			}
			if i%100 == 99 {
				w.Progress(replayd.JobProgress{Phase: "generation", Message: "Writing the answer…",
					Data: map[string]int{"tokens": i + 1, "of": len(toks)}})
			}
		}
		if err := w.Emit(map[string]any{"type": "usage", "outputTokens": len(toks)}); err != nil {
			return nil, err
		}
		return map[string]any{"outputTokens": len(toks), "bytes": len(strings.Join(toks, ""))}, nil
	}
}

var words = strings.Fields(`the log is the only shared state so a reload a redeploy or a
	second process loses nothing a page could resume from every token is written down
	before it is shown naïve relays keep the answer in memory and lose it — replayd
	writes it first then serves it to whoever asks ✓ 🚀`)

// answer is job id's answer in n writes: words (accents, a character of
// two UTF-16 units), now and then the end of a sentence or a paragraph,
// and every 23rd write the first bytes of a character whose last byte is
// the next write, as a tokenizer may cut one. It depends only on its
// arguments.
func answer(id string, n int) []string {
	out := make([]string, 0, n)
	for i := 0; len(out) < n; i++ {
		if i%23 == 22 && len(out) < n-1 {
			out = append(out, " \xf0\x9f\x8e", "\x89") // 🎉 cut mid-character
			continue
		}
		k := int(id[len(id)-1]) + i // the paragraph, in order, from a place of the id's
		tok := " " + words[k%len(words)]
		switch {
		case i%41 == 40:
			tok += ".\n\n"
		case i%9 == 8:
			tok += "."
		}
		out = append(out, tok)
	}
	return out
}

// answerText is the whole of answer(id, n).
func answerText(id string, n int) string { return strings.Join(answer(id, n), "") }
