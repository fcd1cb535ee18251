// Command replayd serves resumable Server-Sent Events for applications not
// written in Go: they publish with POST /publish, browsers subscribe with
// an EventSource (or /replayd.js) and a signed token. See docs/server.md.
//
//	replayd serve --publish-key "$KEY" --token-key secret.key
//	replayd tail --state s.json http://localhost:8080 | your-program
//	replayd publish http://localhost:8080 --key "$KEY" --topic room-1 --data '{"n":1}'
//	replayd version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/replayd/replayd/cmd/replayd/internal/server"
)

// version is set with -ldflags "-X main.version=…"; else the module's.
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Usage:
  replayd serve [flags]        serve events
  replayd tail URL [flags]     print a stream's events, one JSON object a line
  replayd publish URL [flags]  publish one event (--key K --topic T --data JSON)
  replayd version              print the version

replayd COMMAND --help (or replayd help COMMAND) lists the command's flags.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "replayd", buildVersion())
		return 0
	case "help", "-h", "--help":
		if len(args) > 1 && args[0] == "help" {
			switch args[1] {
			case "serve", "tail", "publish":
				return run([]string{args[1], "--help"}, stdout, stderr)
			}
		}
		fmt.Fprint(stdout, usage)
		return 0
	case "serve":
		return serve(args[1:], stdout, stderr)
	case "tail":
		return tail(args[1:], stdout, stderr)
	case "publish":
		return publish(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "replayd: unknown command %q\n%s", args[0], usage)
	return 2
}

func serve(args []string, stdout, stderr io.Writer) int {
	c, err := server.ParseServe(args, os.Getenv, stdout)
	if errors.Is(err, server.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "replayd serve: %v\n", err)
		return 2
	}
	log := server.NewLogger(stderr, c.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	s, err := server.New(ctx, c, log)
	var ue *server.UsageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "replayd serve: %v\n", err)
		return 2
	}
	if err != nil {
		log.Error("cannot start", "error", err)
		return 1
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		s.Close()
		fmt.Fprintf(stderr, "replayd serve: --listen: %v\n", err)
		return 2
	}
	store := "sqlite"
	if c.Postgres != "" {
		store = "postgres"
	}
	log.Info("serving", "version", buildVersion(), "addr", ln.Addr().String(), "store", store,
		"publish_keys", len(c.PublishKeys), "tokens", c.TokenKeyFile != "", "detach", c.Detach)
	if err := s.Serve(ctx, ln); err != nil {
		log.Error("serve", "error", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
