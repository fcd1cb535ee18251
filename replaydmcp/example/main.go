// Command example is an MCP server with a long-running tool, "count",
// whose progress notifications a client resumes with Last-Event-ID after
// the server restarts, or on another server over the same log:
//
//	go run ./example -addr 127.0.0.1:8080 -db mcp.db
//	go run ./example -addr 127.0.0.1:8081 -pg "$REPLAYD_PG_DSN"
//
// It keeps an hour of events (see replaydmcp.Options.Retention).
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/replaydmcp"
	"github.com/replayd/replayd/replaydmcp/internal/progress"
	"github.com/replayd/replayd/replaydpg"
	"github.com/replayd/replayd/sqlitestore"
	"github.com/replayd/replayd/storage"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	dbPath := flag.String("db", "mcp.db", "SQLite file (several servers may share it)")
	dsn := flag.String("pg", "", "PostgreSQL DSN: use it instead of the SQLite file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var store storage.Store
	if *dsn != "" {
		st, err := replaydpg.Open(ctx, *dsn, replaydpg.WithTablePrefix("mcp_"))
		if err != nil {
			log.Fatal(err)
		}
		defer st.Close()
		store = st
	} else {
		db, err := sqlitestore.OpenDB(*dbPath)
		if err != nil {
			log.Fatal(err)
		}
		defer db.Close()
		st, err := sqlitestore.Open(db, sqlitestore.Options{})
		if err != nil {
			log.Fatal(err)
		}
		defer st.Close()
		store = st
	}
	events := replaydmcp.New(store, replaydmcp.Options{Retention: storage.RetentionPolicy{MaxAge: time.Hour}})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("MCP server on http://%s", ln.Addr())
	server := progress.NewServer()
	h := replaydmcp.NewHandler(func(*http.Request) *mcp.Server { return server }, events, nil)
	defer h.Close()
	if err := progress.Serve(ctx, ln, h); err != nil {
		log.Fatal(err)
	}
}
