// Package progress is the MCP server of replaydmcp's example and end-to-end
// tests: one long-running tool that streams progress notifications.
package progress

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// CountArgs are the arguments of the tool "count".
type CountArgs struct {
	N          int `json:"n" jsonschema:"how many steps"`
	IntervalMS int `json:"interval_ms" jsonschema:"milliseconds between steps"`
}

// CountResult is its structured result.
type CountResult struct {
	Counted int `json:"counted"`
}

// NewServer returns an MCP server with the tool "count": it sends one
// progress notification per step (Progress i of Total n, message "step
// i"), IntervalMS apart, then returns the count.
func NewServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "replaydmcp-progress", Version: "v0.1.0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "count", Description: "counts to n, reporting progress at each step"}, count)
	return s
}

func count(ctx context.Context, req *mcp.CallToolRequest, args CountArgs) (*mcp.CallToolResult, CountResult, error) {
	token := req.Params.GetProgressToken()
	tick := time.NewTicker(time.Duration(max(args.IntervalMS, 1)) * time.Millisecond)
	defer tick.Stop()
	for i := 1; i <= args.N; i++ {
		if token != nil {
			err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token, Progress: float64(i), Total: float64(args.N), Message: fmt.Sprintf("step %d", i),
			})
			if err != nil {
				return nil, CountResult{}, err
			}
		}
		if i < args.N {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return nil, CountResult{}, ctx.Err()
			}
		}
	}
	return nil, CountResult{Counted: args.N}, nil
}

// Serve serves h on ln until ctx ends, then shuts the server down.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	<-done
	return nil
}
