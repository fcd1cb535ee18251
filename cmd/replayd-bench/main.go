// Command replayd-bench is replayd's load harness. It runs the SSE server
// in one OS process and the SSE clients in another, all on 127.0.0.1, and
// prints a table of throughput, fan-out, latency, memory, reconnect,
// tail and many-connection (c100k) figures. In the same invocation it measures a raw ceiling — a minimal
// net/http fan-out with a per-client coalescing writer and no log — and raw
// SQLite insert loops, so every figure comes with a ratio measured on the
// same machine at the same time.
//
// Usage:
//
//	go run ./cmd/replayd-bench           # full sizes, about five minutes with c100k
//	go run ./cmd/replayd-bench -quick    # small sizes, well under a minute
//	go run ./cmd/replayd-bench -phases latency -lat-clients 2000 -lat-topics 4 -lat-rates 100
//	                                     # the latency phase alone, varied
//
// The orchestrator (this process) hosts the clients; it spawns its own
// executable in the server role (one fresh server process, and database,
// per measurement), drives it over HTTP control endpoints, and stops it by
// closing its stdin. Every phase has a hard deadline, and a server child
// exits on its own if the orchestrator disappears or its deadline passes.
// The c100k-multi phase (c100kmulti.go) goes past one process's open-file
// limit: several server processes sharing one SQLite file, and as many
// client processes (this executable again, in the client role).
// BENCHMARKS.md has the current figures; git show 60f0bd1:BENCHMARKS.md
// explains each phase's method in full.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

func main() {
	if code, ran := runChild(); ran {
		os.Exit(code)
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "replayd-bench:", err)
		os.Exit(1)
	}
}

// config is the size of every phase.
type config struct {
	extra         extraConfig   // the multitopic and poll phases (extra.go)
	multi         multiConfig   // the c100k-multi phase (c100kmulti.go)
	PublishDur    time.Duration // per publish-throughput measurement
	Publishers    []int         // concurrent publishers
	FanoutClients []int         // clients per fan-out measurement
	FanoutFrames  int           // frames to deliver per fan-out measurement
	LatClients    int           // clients in the latency phases
	LatTopics     int           // topics the latency phase's clients are spread over (0, 1: one)
	LatRates      []int         // events/s
	LatDur        time.Duration // per latency measurement
	IdleClients   int           // idle connections for memory
	IdleSettle    time.Duration // wait before reading RSS
	StormClients  int           // clients in the reconnect storm
	StormBehind   int           // events each storm client missed
	TailClients   int           // clients in the tail latency phase
	TailRate      int           // events/s published by the other process
	TailDur       time.Duration // tail latency measurement
	TailInterval  time.Duration // StartTail interval
	IdleCPUDur    time.Duration // idle CPU window
	PhaseDeadline time.Duration // hard deadline of each measurement
	C100k         c100kConfig   // the c100k phase
}

var sizes = map[string]config{
	"full": {
		PublishDur: 3 * time.Second, Publishers: []int{1, 8, 64},
		FanoutClients: []int{100, 1000, 5000}, FanoutFrames: 3_000_000,
		LatClients: 1000, LatRates: []int{100, 1000}, LatDur: 5 * time.Second,
		IdleClients: 2000, IdleSettle: time.Second,
		StormClients: 1000, StormBehind: 100,
		TailClients: 10, TailRate: 50, TailDur: 4 * time.Second, TailInterval: 10 * time.Millisecond,
		IdleCPUDur:    5 * time.Second,
		PhaseDeadline: 60 * time.Second,
		C100k:         c100kConfig{Conns: 100_000, Heartbeat: 15 * time.Second, CPUWindow: 30 * time.Second, Broadcasts: 7, Deadline: 4 * time.Minute},
	},
	"quick": {
		PublishDur: 500 * time.Millisecond, Publishers: []int{1, 8, 64},
		FanoutClients: []int{100, 1000}, FanoutFrames: 300_000,
		LatClients: 200, LatRates: []int{100, 1000}, LatDur: time.Second,
		IdleClients: 500, IdleSettle: 500 * time.Millisecond,
		StormClients: 300, StormBehind: 100,
		TailClients: 5, TailRate: 50, TailDur: time.Second, TailInterval: 10 * time.Millisecond,
		IdleCPUDur:    time.Second,
		PhaseDeadline: 30 * time.Second,
		C100k:         c100kConfig{Conns: 10_000, Heartbeat: 15 * time.Second, CPUWindow: 15 * time.Second, Broadcasts: 5, Deadline: 2 * time.Minute},
	},
	// tiny proves the harness works (main_test.go); its figures mean little.
	"tiny": {
		PublishDur: 100 * time.Millisecond, Publishers: []int{1, 8},
		FanoutClients: []int{5}, FanoutFrames: 500,
		LatClients: 5, LatRates: []int{100}, LatDur: 200 * time.Millisecond,
		IdleClients: 10, IdleSettle: 20 * time.Millisecond,
		StormClients: 10, StormBehind: 10,
		TailClients: 2, TailRate: 50, TailDur: 200 * time.Millisecond, TailInterval: 10 * time.Millisecond,
		IdleCPUDur:    100 * time.Millisecond,
		PhaseDeadline: 15 * time.Second,
		C100k:         c100kConfig{Conns: 20, Heartbeat: 100 * time.Millisecond, CPUWindow: 300 * time.Millisecond, Broadcasts: 2, Deadline: 20 * time.Second},
	},
}

var allPhases = []string{"publish", "fanout", "latency", "idle", "storm", "tail", "c100k"}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replayd-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "small sizes: everything in well under a minute")
	size := fs.String("size", "full", "sizes: full, quick or tiny")
	phases := fs.String("phases", strings.Join(allPhases, ","), "phases to run, comma-separated")
	verbose := fs.Bool("v", false, "log progress to stderr")
	conns := fs.Int("conns", 0, "connections in the c100k and c100k-multi phases (default: the size's)")
	pollClients := fs.Int("poll-clients", 0, "clients of the pollrate phase (default: the size's)")
	pollLimit := fs.Int("poll-limit", 0, "limit of each poll of the pollrate phase (default: the size's)")
	tail := fs.Duration("tail-interval", 0, "StartTail interval of the tail and c100k-multi phases (default: the size's)")
	procs := fs.Int("procs", 0, "server processes (and as many client processes) in the c100k-multi phase (default: the size's; full: as few as the open-file limit allows)")
	fanout := fs.String("fanout-clients", "", "client counts of the fan-out phase, comma-separated (default: the size's)")
	latClients := fs.Int("lat-clients", 0, "clients of the latency phase (default: the size's; full: 1000)")
	latTopics := fs.Int("lat-topics", 1, "topics the latency phase's clients are spread over, client i on topic i mod N; each topic is published at the phase's rate, so every client still receives that rate")
	latRates := fs.String("lat-rates", "", "publish rates of the latency phase, events/s per topic, comma-separated (default: the size's; full: 100,1000)")
	latDur := fs.Duration("lat-dur", 0, "length of each latency measurement (one raw, one hub per rate) (default: the size's; full: 5s)")
	modes := fs.String("c100k-modes", "raw,hub,detach", "servers measured by the c100k phases, in order (c100k-multi skips raw)")
	err := fs.Parse(args)
	if err != nil {
		return err
	}
	if *quick {
		*size = "quick"
	}
	cfg, ok := sizes[*size]
	if !ok {
		return fmt.Errorf("unknown size %q", *size)
	}
	cfg.extra = extraSizes[*size]
	if *pollClients > 0 {
		cfg.extra.PollClients = *pollClients
	}
	if *pollLimit > 0 {
		cfg.extra.PollLimit = *pollLimit
	}
	cfg.multi = multiSizes[*size]
	if *conns > 0 {
		cfg.C100k.Conns = *conns
		cfg.multi.Conns = *conns
	}
	if *tail > 0 {
		cfg.TailInterval = *tail
		cfg.multi.Tail = *tail
	}
	if *procs > 0 {
		cfg.multi.Procs = *procs
	}
	cfg.C100k.Modes = strings.Split(*modes, ",")
	if *fanout != "" {
		if cfg.FanoutClients, err = positiveInts(*fanout); err != nil {
			return fmt.Errorf("bad -fanout-clients %q", *fanout)
		}
	}
	if *latClients > 0 {
		cfg.LatClients = *latClients
	}
	if *latDur > 0 {
		cfg.LatDur = *latDur
	}
	if *latTopics < 1 {
		return fmt.Errorf("bad -lat-topics %d", *latTopics)
	}
	cfg.LatTopics = *latTopics
	if *latRates != "" {
		if cfg.LatRates, err = positiveInts(*latRates); err != nil {
			return fmt.Errorf("bad -lat-rates %q", *latRates)
		}
	}
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "replayd-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	b := &bench{cfg: cfg, dir: dir, out: stdout}
	if *verbose {
		b.log = stderr
	}
	fmt.Fprintf(stdout, "replayd-bench -size=%s: %s\n\n", *size, machine())
	want := map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		want[strings.TrimSpace(p)] = true
	}
	for _, p := range allPhases {
		if !want[p] {
			continue
		}
		delete(want, p)
		b.logf("phase %s", p)
		if err := b.phase(ctx, p); err != nil {
			b.add(row{Figure: p, Replayd: "error: " + err.Error()})
			b.logf("phase %s: %v", p, err)
		}
	}
	for p := range want {
		return fmt.Errorf("unknown phase %q", p)
	}
	b.print()
	if b.failed > 0 {
		return fmt.Errorf("%d measurement(s) failed", b.failed)
	}
	return nil
}

// positiveInts parses a comma-separated list of positive integers.
func positiveInts(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func (b *bench) phase(ctx context.Context, name string) error {
	if fn := extraPhases[name]; fn != nil {
		return fn(b, ctx)
	}
	switch name {
	case "publish":
		return b.publishPhase(ctx)
	case "fanout":
		return b.fanoutPhase(ctx)
	case "latency":
		return b.latencyPhase(ctx)
	case "idle":
		return b.idlePhase(ctx)
	case "storm":
		return b.stormPhase(ctx)
	case "tail":
		return b.tailPhase(ctx)
	case "c100k":
		return b.c100kPhase(ctx)
	}
	return nil
}

// machine describes the host: CPUs, model, Go and SQLite versions.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs (%s), GOMAXPROCS %d, %s, SQLite %s", runtime.NumCPU(), model, runtime.GOMAXPROCS(0), runtime.Version(), sqliteVersion())
}

func sqliteVersion() string {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		return "?"
	}
	defer db.Close()
	var v string
	if err := db.QueryRow("SELECT sqlite_version()").Scan(&v); err != nil {
		return "?"
	}
	return v
}
