// A consumer of replayd, built by .ci/consumer.sh in a module of its own
// outside this tree, with the replayd modules fetched from a proxy as a
// user fetches them (GOWORK=off, no replace). It runs a hub over SQLite,
// publishes, reads the event back through Replay and the SSE handler,
// gathers replaydprom's metrics, and, when REPLAYD_PG_DSN names a
// PostgreSQL, does the same over replaydpg. It exits 0 only if all of it
// worked.
package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydpg"
	"github.com/replayd/replayd/replaydprom"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "replayd-consumer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := replayd.OpenDB(filepath.Join(dir, "events.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	hub, err := replayd.New(db, replayd.Options{})
	if err != nil {
		return err
	}
	if err := exercise(ctx, "sqlite", hub); err != nil {
		return err
	}

	dsn := os.Getenv("REPLAYD_PG_DSN")
	if dsn == "" {
		fmt.Println("postgresql: skipped (REPLAYD_PG_DSN not set); replaydpg built and linked")
		return nil
	}
	store, err := replaydpg.Open(ctx, dsn, replaydpg.WithTablePrefix("consumer_"))
	if err != nil {
		return err
	}
	defer store.Close()
	pghub, err := replayd.NewWithStore(store, replayd.Options{})
	if err != nil {
		return err
	}
	return exercise(ctx, "postgresql", pghub)
}

// exercise publishes one event on hub, reads it back through Replay and
// through the SSE handler, gathers the hub's metrics, and closes the hub.
func exercise(ctx context.Context, name string, hub *replayd.EventHub) error {
	defer hub.Close()
	reg := prometheus.NewRegistry()
	if err := replaydprom.Register(reg, hub); err != nil {
		return err
	}
	text := "hello from a consumer " + strconv.FormatInt(time.Now().UnixNano(), 10)
	ev, err := hub.Publish(ctx, "news", map[string]string{"text": text})
	if err != nil {
		return fmt.Errorf("%s: publish: %w", name, err)
	}
	got, err := hub.Replay(ctx, "news", ev.Sequence-1, 1)
	if err != nil {
		return fmt.Errorf("%s: replay: %w", name, err)
	}
	if len(got) != 1 || got[0].Sequence != ev.Sequence || !strings.Contains(string(got[0].Payload), text) {
		return fmt.Errorf("%s: replay after %d read %+v, want the event just published", name, ev.Sequence-1, got)
	}
	if err := readSSE(ctx, hub, ev.Sequence-1, text); err != nil {
		return fmt.Errorf("%s: sse: %w", name, err)
	}
	families, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("%s: metrics: %w", name, err)
	}
	published := false
	for _, f := range families {
		published = published || f.GetName() == "replayd_events_published_total"
	}
	if !published {
		return fmt.Errorf("%s: metrics: no replayd_events_published_total among %d families", name, len(families))
	}
	fmt.Printf("%s: published sequence %d, read it back by Replay and SSE; %d metric families\n", name, ev.Sequence, len(families))
	return nil
}

// readSSE resumes the hub's SSE stream of topic news after the sequence
// after and reads until a data line holds text.
func readSSE(ctx context.Context, hub *replayd.EventHub, after int64, text string) error {
	srv := httptest.NewServer(hub.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/?topic=news", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data:") && strings.Contains(sc.Text(), text) {
			return nil
		}
	}
	return fmt.Errorf("stream ended before the event arrived: %v", sc.Err())
}
