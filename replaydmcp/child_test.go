package replaydmcp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/internal/childproc"
	"github.com/replayd/replayd/replaydmcp/internal/progress"
	"github.com/replayd/replayd/replaydpg"
	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

// childConfig is what a child server process serves, and on what.
type childConfig struct {
	Addr     string // listen address; "127.0.0.1:0" for any port
	DB       string // SQLite file, or
	PGDSN    string // PostgreSQL DSN, with
	PGPrefix string // its table prefix
	Plain    bool   // the SDK's handler, not Handler
}

const childEnv = "REPLAYDMCP_CHILD"

// TestChildServer is the child server process of the end-to-end tests
// (startChild runs it): it serves progress.Serve on the configured log
// until its stdin closes or it is killed.
func TestChildServer(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("the server process of the end-to-end tests, run by them")
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var st storage.Store
	if cfg.PGDSN != "" {
		pg, err := replaydpg.Open(ctx, cfg.PGDSN, replaydpg.WithTablePrefix(cfg.PGPrefix))
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Close()
		st = pg
	} else {
		db, err := sqlitestore.OpenDB(cfg.DB)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		sq, err := sqlitestore.Open(db, sqlitestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer sq.Close()
		st = sq
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	go func() { // the parent closes stdin to stop the child
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	server := progress.NewServer()
	get := func(*http.Request) *mcp.Server { return server }
	events := New(st, Options{})
	var h http.Handler
	if cfg.Plain {
		h = mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{EventStore: events})
	} else {
		rh := NewHandler(get, events, nil)
		defer rh.Close()
		h = rh
	}
	if err := progress.Serve(ctx, ln, h); err != nil {
		t.Fatal(err)
	}
}

// startChild starts a server process and returns it with its address.
func startChild(t *testing.T, cfg childConfig) (*childproc.Proc, string) {
	t.Helper()
	spec, _ := json.Marshal(cfg)
	addr := make(chan string, 1)
	p := childproc.Start(t, "TestChildServer", func(stdout io.Reader) {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				addr <- a
				return
			}
		}
	}, childEnv+"="+string(spec))
	select {
	case a := <-addr:
		return p, a
	case <-time.After(60 * time.Second):
		p.Kill()
		p.Wait()
		t.Fatalf("the child server did not start: %s", p.Stderr())
		return nil, ""
	}
}

// storedProgress returns the progress values of the notifications stored
// in the log, in log order.
func storedProgress(t testing.TB, st storage.Store) []float64 {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	var out []float64
	req := storage.ReadRequest{Limit: 1000}
	for {
		page, err := st.Read(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Events {
			req.After = ev.Sequence
			if ev.Type != typeText {
				continue
			}
			var msg struct {
				Method string
				Params struct{ Progress float64 }
			}
			if json.Unmarshal(ev.Payload, &msg) == nil && msg.Method == "notifications/progress" {
				out = append(out, msg.Params.Progress)
			}
		}
		if !page.More {
			return out
		}
	}
}

// waitStored waits until the log holds at least n progress notifications.
func waitStored(t testing.TB, st storage.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for len(storedProgress(t, st)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the log did not reach %d progress notifications in 30s", n)
		}
		<-tick.C
	}
}
