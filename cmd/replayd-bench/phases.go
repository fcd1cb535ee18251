package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/replayd/replayd"
)

// bench runs the phases and collects the table.
type bench struct {
	cfg    config
	dir    string
	out    io.Writer
	log    io.Writer // nil: quiet
	rows   []row
	nextDB int
	failed int
}

// row is one line of the result table.
type row struct {
	Figure  string
	Replayd string
	Raw     string // the baseline measured in the same run
	Ratio   string
	Target  string
	Status  string // "met", "NOT MET", or "" when there is no target
}

func (b *bench) add(r row) {
	if strings.HasPrefix(r.Replayd, "error") || strings.HasPrefix(r.Raw, "error") {
		b.failed++
	}
	b.rows = append(b.rows, r)
	b.logf("%s: %s | %s | %s | %s", r.Figure, r.Replayd, r.Raw, r.Ratio, r.Status)
}

func (b *bench) logf(format string, args ...any) {
	if b.log != nil {
		fmt.Fprintf(b.log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

func (b *bench) print() {
	tw := tabwriter.NewWriter(b.out, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "figure\treplayd\tbaseline (same run)\tratio\ttarget\tstatus")
	fmt.Fprintln(tw, "------\t-------\t-------------------\t-----\t------\t------")
	for _, r := range b.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Figure, r.Replayd, r.Raw, r.Ratio, r.Target, r.Status)
	}
	tw.Flush()
}

// server starts a fresh server process with a fresh database.
func (b *bench) server(ctx context.Context, mode string, maxBuffered int, heartbeat time.Duration) (*serverProc, error) {
	b.nextDB++
	return startServer(ctx, serverConfig{
		Mode:        mode,
		DB:          filepath.Join(b.dir, fmt.Sprintf("events-%d.db", b.nextDB)),
		MaxBuffered: maxBuffered,
		Heartbeat:   heartbeat,
		Deadline:    b.cfg.PhaseDeadline + 15*time.Second,
	})
}

// withDeadline runs fn under the phase deadline.
func (b *bench) withDeadline(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.PhaseDeadline)
	defer cancel()
	return fn(ctx)
}

func status(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

func ratio(a, base float64) (float64, string) {
	if base <= 0 {
		return 0, "-"
	}
	r := a / base
	return r, fmt.Sprintf("%.2f×", r)
}

// num formats n with thousands separators.
func num(n float64) string {
	s := strconv.FormatInt(int64(n+0.5), 10)
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	return string(out)
}

func ms(us uint64) string { return fmt.Sprintf("%.1f ms", float64(us)/1000) }

// publishPhase: Publish throughput at 1, 8, 64 concurrent publishers, and
// the raw insert loops at 1 and 64 rows per transaction, in one server. Each
// target pair (1 publisher and 1-row transactions, 64 and 64-row ones) is
// measured in four alternating turns, the order swapped every turn, so both
// sides of a ratio see the same machine.
func (b *bench) publishPhase(ctx context.Context) error {
	return b.withDeadline(ctx, func(ctx context.Context) error {
		srv, err := b.server(ctx, "hub", 0, -1)
		if err != nil {
			return err
		}
		defer srv.stop()
		const turns = 4
		dur := max(b.cfg.PublishDur/turns, 50*time.Millisecond).String()
		run := func(path string, sum *rateResult) error {
			var r rateResult
			if err := srv.ctl(ctx, path, &r); err != nil {
				return err
			}
			if r.Err != "" {
				return fmt.Errorf("%s: %s", path, r.Err)
			}
			sum.Events += r.Events
			sum.Seconds += r.Seconds
			return nil
		}
		pubPath := func(c int) string { return fmt.Sprintf("/ctl/pubbench?conc=%d&dur=%s", c, dur) }
		rawPath := func(rows int) string { return fmt.Sprintf("/ctl/rawinsert?rows=%d&dur=%s", rows, dur) }
		pub, raw := map[int]float64{}, map[int]float64{}
		for _, c := range b.cfg.Publishers {
			rows := 0
			switch c {
			case 1:
				rows = 1
			case 64:
				rows = 64
			}
			var p, r rateResult
			for k := range turns {
				if rows == 0 { // no target: measured once
					if k == 0 {
						if err := run(pubPath(c), &p); err != nil {
							return err
						}
					}
					continue
				}
				first, second := func() error { return run(rawPath(rows), &r) }, func() error { return run(pubPath(c), &p) }
				if k%2 == 1 {
					first, second = second, first
				}
				if err := first(); err != nil {
					return err
				}
				if err := second(); err != nil {
					return err
				}
			}
			pub[c] = p.perSecond()
			if rows > 0 {
				raw[rows] = r.perSecond()
			}
		}
		if raw[64] == 0 { // 64 publishers not asked for: the 64-row baseline alone
			var r rateResult
			if err := run(rawPath(64), &r); err != nil {
				return err
			}
			raw[64] = r.perSecond()
		}
		for _, c := range b.cfg.Publishers {
			r := row{Figure: fmt.Sprintf("publish, %d publisher(s), events/s", c), Replayd: num(pub[c])}
			switch c {
			case 1:
				x, s := ratio(pub[c], raw[1])
				r.Raw, r.Ratio = "raw 1-row tx: "+num(raw[1]), s
				r.Target, r.Status = "≥ 0.8× raw 1-row tx", status(x >= 0.8)
			case 64:
				x, s := ratio(pub[c], raw[64])
				r.Raw, r.Ratio = "raw 64-row tx: "+num(raw[64]), s
				r.Target, r.Status = "≥ 0.8× raw 64-row tx", status(x >= 0.8)
			default:
				_, s := ratio(pub[c], raw[64])
				r.Raw, r.Ratio = "raw 64-row tx: "+num(raw[64]), s
			}
			b.add(r)
		}
		return nil
	})
}

// fanoutPhase: N clients on one topic; the server publishes as fast as it
// can (replayd: 16 concurrent publishers, group commit); frames/s is every
// client's frames over the time from the first publish to the moment the
// last client has the last frame. Raw and replayd alternate per size, and
// neither caps its queues (the publisher runs ahead of the clients on
// purpose).
func (b *bench) fanoutPhase(ctx context.Context) error {
	for _, n := range b.cfg.FanoutClients {
		events := max(b.cfg.FanoutFrames/n, 10)
		var res [3]fanout
		for i, mode := range []string{"raw", "hub", "detach"} {
			err := b.withDeadline(ctx, func(ctx context.Context) error {
				var err error
				res[i], err = b.fanoutOnce(ctx, mode, n, events)
				return err
			})
			if err != nil {
				res[i].err = err
			}
		}
		r := row{Figure: fmt.Sprintf("fan-out, %s clients × %s events, frames/s", num(float64(n)), num(float64(events))),
			Replayd: res[1].String(), Raw: "raw ceiling: " + res[0].String()}
		if res[0].err == nil && res[1].err == nil {
			x, s := ratio(res[1].rate, res[0].rate)
			r.Ratio = s
			if n == 1000 {
				r.Target, r.Status = "≥ 0.8× raw ceiling", status(x >= 0.8)
			}
		}
		b.add(r)
		d := row{Figure: fmt.Sprintf("fan-out, %s clients, DetachConnections, frames/s", num(float64(n))),
			Replayd: res[2].String(), Raw: "today's path: " + res[1].String()}
		if res[1].err == nil && res[2].err == nil {
			x, s := ratio(res[2].rate, res[1].rate)
			d.Ratio = s
			if n == 1000 {
				d.Target, d.Status = "≥ 0.95× today's path", status(x >= 0.95)
			}
		}
		b.add(d)
	}
	return nil
}

type fanout struct {
	rate     float64 // frames/s
	cpuFrame float64 // server CPU µs per frame
	err      error
}

func (f fanout) String() string {
	if f.err != nil {
		return "error: " + f.err.Error()
	}
	return fmt.Sprintf("%s (%.2f µs server CPU/frame)", num(f.rate), f.cpuFrame)
}

func (b *bench) fanoutOnce(ctx context.Context, mode string, n, events int) (fanout, error) {
	conc := 16
	if mode == "raw" {
		conc = 1
	}
	return b.fanoutWith(ctx, mode, n, events, conc, func(int) string { return "/events?topic=fan" }, "fan")
}

// fanoutWith runs one fan-out measurement on a fresh server of mode: n
// clients, client i requesting path(i), events published on topic ("":
// broadcasts) by conc publishers; the figure is frames/s until the last
// client has the last frame, and server CPU per frame. A gap frame fails it.
func (b *bench) fanoutWith(ctx context.Context, mode string, n, events, conc int, path func(int) string, topic string) (fanout, error) {
	var out fanout
	srv, err := b.server(ctx, mode, -1, -1)
	if err != nil {
		return out, err
	}
	defer srv.stop()
	f, err := dialFleet(ctx, srv.addr, n, 200, path, nil, 0)
	if err != nil {
		return out, err
	}
	defer f.close()
	done := f.expect(int64(events))
	st0, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	var pr publishResult
	if err := srv.ctl(ctx, fmt.Sprintf("/ctl/publish?n=%d&conc=%d&topic=%s", events, conc, url.QueryEscape(topic)), &pr); err != nil {
		return out, err
	}
	if pr.Errors > 0 {
		return out, fmt.Errorf("%d publishes failed: %s", pr.Errors, pr.FirstErr)
	}
	select {
	case <-done:
	case <-ctx.Done():
		frames, short, ended := f.progress()
		return out, fmt.Errorf("deadline: %d of %d frames, %d clients short, %d streams ended", frames, n*events, short, ended)
	}
	st1, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	if g := f.gaps(); g > 0 {
		return out, fmt.Errorf("%d gap frames", g)
	}
	frames := float64(n) * float64(events)
	out.rate = frames / (float64(f.lastReached()-pr.StartNanos) / 1e9)
	out.cpuFrame = float64(st1.CPUNanos-st0.CPUNanos) / 1e3 / frames
	return out, nil
}

// latencyPhase: N clients, the server publishes at a fixed rate for a
// while, each payload stamped with the wall clock just before its Publish;
// a client's latency is its receipt time minus the stamp. Replayd runs with
// its default slow-consumer cap (1 MiB). With LatTopics = T > 1 the clients
// are spread over T topics (client i on lat-(i mod T)) and each topic gets
// the rate, so every client still receives rate events/s and the server
// publishes T × rate events/s in all, round-robin over the topics; the raw
// ceiling routes by topic too (raw.go).
func (b *bench) latencyPhase(ctx context.Context) error {
	n, topics := b.cfg.LatClients, max(b.cfg.LatTopics, 1)
	for _, rate := range b.cfg.LatRates {
		events := int(float64(rate) * b.cfg.LatDur.Seconds())
		var res [2]latency
		for i, mode := range []string{"raw", "hub"} {
			err := b.withDeadline(ctx, func(ctx context.Context) error {
				var err error
				res[i], err = b.latencyOnce(ctx, mode, n, topics, rate, events)
				return err
			})
			if err != nil {
				res[i].err = err
			}
		}
		clients := num(float64(n)) + " clients"
		if topics > 1 {
			clients += fmt.Sprintf(" over %d topics", topics)
		}
		r := row{Figure: fmt.Sprintf("latency, %s × %s events/s for %v", clients, num(float64(rate)), b.cfg.LatDur),
			Replayd: res[1].String(), Raw: "raw ceiling: " + res[0].String()}
		if res[0].err == nil && res[1].err == nil {
			x, s := ratio(float64(res[1].p99), float64(res[0].p99))
			r.Ratio = "p99 " + s
			switch rate {
			case 100:
				r.Target, r.Status = "p99 ≤ 1.5× raw", status(x <= 1.5)
			case 1000:
				sustained := res[1].published >= 0.98*float64(rate*topics) && res[1].complete
				r.Target, r.Status = "1,000 events/s sustained", status(sustained)
			}
		}
		b.add(r)
	}
	return nil
}

type latency struct {
	p50, p99, max uint64  // µs
	published     float64 // achieved publish rate, events/s, all topics
	delivered     float64 // events/s each client received, first publish to last receipt
	complete      bool    // every client got every event
	note          string
	err           error
}

func (l latency) String() string {
	if l.err != nil {
		return "error: " + l.err.Error()
	}
	s := fmt.Sprintf("p50 %s, p99 %s, max %s; published %s/s, delivered %s/s", ms(l.p50), ms(l.p99), ms(l.max), num(l.published), num(l.delivered))
	if l.note != "" {
		s += "; " + l.note
	}
	return s
}

// latencyOnce is one latency measurement on a fresh server of mode: n
// clients spread over topics topics, each topic published events times at
// rate events/s.
func (b *bench) latencyOnce(ctx context.Context, mode string, n, topics, rate, events int) (latency, error) {
	var out latency
	srv, err := b.server(ctx, mode, 0, -1)
	if err != nil {
		return out, err
	}
	defer srv.stop()
	path := func(int) string { return "/events?topic=lat" }
	if topics > 1 {
		path = func(i int) string { return fmt.Sprintf("/events?topic=lat-%d", i%topics) }
	}
	f, err := dialFleet(ctx, srv.addr, n, 200, path, nil, 0)
	if err != nil {
		return out, err
	}
	defer f.close()
	done := f.expect(int64(events))
	f.recording.Store(true)
	conc := 8
	if mode == "raw" {
		conc = 1
	}
	var pr publishResult
	if err := srv.ctl(ctx, fmt.Sprintf("/ctl/publish?n=%d&rate=%d&conc=%d&topic=lat&topics=%d", events*topics, rate*topics, conc, topics), &pr); err != nil {
		return out, err
	}
	if pr.Errors > 0 {
		return out, fmt.Errorf("%d publishes failed: %s", pr.Errors, pr.FirstErr)
	}
	wait := time.NewTimer(10 * time.Second)
	defer wait.Stop()
	select {
	case <-done:
		out.complete = true
	case <-ctx.Done():
	case <-wait.C:
	}
	f.recording.Store(false)
	if !out.complete {
		frames, short, ended := f.progress()
		out.note = fmt.Sprintf("INCOMPLETE: %d of %d frames, %d clients short, %d streams ended", frames, n*events, short, ended)
	}
	h := f.latency()
	out.p50, out.p99, out.max = h.quantile(0.50), h.quantile(0.99), h.maximum()
	// The last of n paced publishes starts (n-1)/rate after the first:
	// count the run as n/rate at least, so pacing alone never reads as
	// faster than the rate.
	elapsed := max(float64(pr.EndNanos-pr.StartNanos)/1e9, float64(pr.Published)/float64(rate*topics))
	out.published = float64(pr.Published) / elapsed
	if last := f.lastReached(); out.complete && last > pr.StartNanos {
		out.delivered = float64(events) / (float64(last-pr.StartNanos) / 1e9)
	}
	return out, nil
}

// idlePhase: server RSS with no clients, then with N idle clients spread
// over 100 topics; the difference per connection. Measured twice: as the
// kernel sees it, and after runtime.GC + debug.FreeOSMemory.
func (b *bench) idlePhase(ctx context.Context) error {
	var res [3]idle
	for i, mode := range []string{"raw", "hub", "detach"} {
		err := b.withDeadline(ctx, func(ctx context.Context) error {
			var err error
			res[i], err = b.idleOnce(ctx, mode, b.cfg.IdleClients)
			return err
		})
		if err != nil {
			res[i].err = err
		}
	}
	r := row{Figure: fmt.Sprintf("memory per idle connection (RSS, 0 → %s clients)", num(float64(b.cfg.IdleClients))),
		Replayd: res[1].String(), Raw: "raw ceiling: " + res[0].String(), Target: "≤ 20 KiB"}
	if res[0].err == nil && res[1].err == nil {
		_, r.Ratio = ratio(res[1].perConn, res[0].perConn)
		r.Status = status(res[1].perConn <= 20<<10)
	}
	b.add(r)
	d := row{Figure: fmt.Sprintf("memory per idle connection, DetachConnections (0 → %s clients)", num(float64(b.cfg.IdleClients))),
		Replayd: res[2].String(), Raw: "raw ceiling: " + res[0].String(), Target: "≤ 12 KiB"}
	if res[0].err == nil && res[2].err == nil {
		_, d.Ratio = ratio(res[2].perConn, res[0].perConn)
		d.Status = status(res[2].perConn <= 12<<10)
	}
	b.add(d)
	return nil
}

type idle struct {
	perConn, perConnGC float64 // bytes
	heapStack          float64 // Go heap in use + stacks, bytes per connection
	err                error
}

func (d idle) String() string {
	if d.err != nil {
		return "error: " + d.err.Error()
	}
	return fmt.Sprintf("%.1f KiB (%.1f KiB after GC+FreeOSMemory; Go heap+stacks %.1f KiB)", d.perConn/1024, d.perConnGC/1024, d.heapStack/1024)
}

func (b *bench) idleOnce(ctx context.Context, mode string, n int) (idle, error) {
	var out idle
	srv, err := b.server(ctx, mode, 0, 0)
	if err != nil {
		return out, err
	}
	defer srv.stop()
	// Warm up: one connection, so code paths and pools are in place.
	f, err := dialFleet(ctx, srv.addr, 1, 1, func(int) string { return "/events?topic=warm" }, nil, 0)
	if err != nil {
		return out, err
	}
	f.close()
	if err := waitClients(ctx, srv, 0); err != nil {
		return out, err
	}
	time.Sleep(b.cfg.IdleSettle)
	s0, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	s0gc, err := srv.stats(ctx, true)
	if err != nil {
		return out, err
	}
	f, err = dialFleet(ctx, srv.addr, n, 200, func(i int) string { return fmt.Sprintf("/events?topic=idle-%02d", i%100) }, nil, 0)
	if err != nil {
		return out, err
	}
	defer f.close()
	if err := waitClients(ctx, srv, n); err != nil {
		return out, err
	}
	time.Sleep(b.cfg.IdleSettle)
	s1, err := srv.stats(ctx, false)
	if err != nil {
		return out, err
	}
	s1gc, err := srv.stats(ctx, true)
	if err != nil {
		return out, err
	}
	out.perConn = float64(s1.RSSKiB-s0.RSSKiB) * 1024 / float64(n)
	out.perConnGC = float64(s1gc.RSSKiB-s0gc.RSSKiB) * 1024 / float64(n)
	out.heapStack = float64(s1gc.HeapInuse+s1gc.StackInuse-s0gc.HeapInuse-s0gc.StackInuse) / float64(n)
	return out, nil
}

// waitClients waits until the server counts n open streams.
func waitClients(ctx context.Context, srv *serverProc, n int) error {
	for {
		st, err := srv.stats(ctx, false)
		if err != nil {
			return err
		}
		if st.Clients == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server has %d streams, want %d: %w", st.Clients, n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stormPhase: N clients connect and read their hello, disconnect, miss B
// events, then all reconnect at once with Last-Event-ID. Measured: time
// from the reconnect until every client has its B replayed events, and
// until every client also has one live event published after that.
func (b *bench) stormPhase(ctx context.Context) error {
	n, behind := b.cfg.StormClients, b.cfg.StormBehind
	r := row{Figure: fmt.Sprintf("reconnect storm, %s clients × %d events behind", num(float64(n)), behind), Target: "≤ 2 s"}
	err := b.withDeadline(ctx, func(ctx context.Context) error {
		srv, err := b.server(ctx, "hub", 0, 0)
		if err != nil {
			return err
		}
		defer srv.stop()
		path := func(int) string { return "/events?topic=storm" }
		f, err := dialFleet(ctx, srv.addr, n, 200, path, nil, 0)
		if err != nil {
			return err
		}
		cursors := make([]string, n)
		for i, c := range f.clients {
			cursors[i] = strconv.FormatInt(c.cursor.Load(), 10)
		}
		f.close()
		if err := waitClients(ctx, srv, 0); err != nil {
			return err
		}
		var pr publishResult
		if err := srv.ctl(ctx, fmt.Sprintf("/ctl/publish?n=%d&conc=1&topic=storm", behind), &pr); err != nil {
			return err
		}
		start := time.Now()
		f, err = dialFleet(ctx, srv.addr, n, 0, path, func(i int) string { return cursors[i] }, int64(behind))
		if err != nil {
			return err
		}
		defer f.close()
		select {
		case <-f.done():
		case <-ctx.Done():
			frames, short, ended := f.progress()
			return fmt.Errorf("deadline: %d of %d frames, %d clients short, %d streams ended", frames, n*behind, short, ended)
		}
		backlog := time.Duration(f.lastReached() - start.UnixNano())
		done := f.expect(1)
		if err := srv.ctl(ctx, "/ctl/publish?n=1&topic=storm", &pr); err != nil {
			return err
		}
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("live probe: %w", ctx.Err())
		}
		live := time.Duration(f.lastReached() - start.UnixNano())
		r.Replayd = fmt.Sprintf("all backlogs in %v, all live (probe received) at %v; %d gap frames", backlog.Round(time.Millisecond), live.Round(time.Millisecond), f.gaps())
		r.Status = status(live <= 2*time.Second && f.gaps() == 0)
		return nil
	})
	if err != nil {
		r.Replayd = "error: " + err.Error()
	}
	b.add(r)
	return nil
}

// tailPhase: a server whose hub tails the database while this process, a
// second hub on the same file, publishes; clients measure latency from the
// publish in this process to receipt through the server's tail. Then the
// server's CPU while idle, without and with the tail.
func (b *bench) tailPhase(ctx context.Context) error {
	interval := b.cfg.TailInterval
	lat := row{Figure: fmt.Sprintf("cross-process tail latency (StartTail %v, %d events/s)", interval, b.cfg.TailRate)}
	cpu := row{Figure: fmt.Sprintf("tail CPU while idle (StartTail %v, fixed cadence)", interval), Target: "no full query per idle poll"}
	err := b.withDeadline(ctx, func(ctx context.Context) error {
		srv, err := b.server(ctx, "hub", 0, -1)
		if err != nil {
			return err
		}
		defer srv.stop()
		dbPath := filepath.Join(b.dir, fmt.Sprintf("events-%d.db", b.nextDB))

		idleCPU := func() (time.Duration, error) {
			s0, err := srv.stats(ctx, false)
			if err != nil {
				return 0, err
			}
			select {
			case <-time.After(b.cfg.IdleCPUDur):
			case <-ctx.Done():
				return 0, ctx.Err()
			}
			s1, err := srv.stats(ctx, false)
			return time.Duration(s1.CPUNanos - s0.CPUNanos), err
		}
		base, err := idleCPU()
		if err != nil {
			return err
		}
		if err := srv.ctl(ctx, "/ctl/tail?interval="+interval.String(), nil); err != nil {
			return err
		}
		tailing, err := idleCPU()
		if err != nil {
			return err
		}
		secs := b.cfg.IdleCPUDur.Seconds()
		polls := secs / interval.Seconds()
		extra := tailing - base
		cpu.Replayd = fmt.Sprintf("%.2f%% of a core (%.1f µs/poll)", 100*extra.Seconds()/secs, float64(extra.Microseconds())/polls)
		cpu.Raw = fmt.Sprintf("server idle without tail: %.2f%% of a core", 100*base.Seconds()/secs)
		cpu.Status = "see BenchmarkTailIdlePoll"

		f, err := dialFleet(ctx, srv.addr, b.cfg.TailClients, 0, func(int) string { return "/events?topic=tail" }, nil, 0)
		if err != nil {
			return err
		}
		defer f.close()
		db, err := replayd.OpenDB(dbPath)
		if err != nil {
			return err
		}
		defer db.Close()
		hub, err := replayd.New(db, replayd.Options{})
		if err != nil {
			return err
		}
		defer hub.Close()
		events := max(1, int(float64(b.cfg.TailRate)*b.cfg.TailDur.Seconds()))
		done := f.expect(int64(events))
		f.recording.Store(true)
		start := time.Now()
		var buf []byte
		for i := range events {
			if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(b.cfg.TailRate))); d > 0 {
				time.Sleep(d)
			}
			buf = stampedPayload(buf)
			if _, err := hub.Publish(ctx, "tail", json.RawMessage(buf)); err != nil {
				return err
			}
		}
		select {
		case <-done:
		case <-ctx.Done():
			frames, short, ended := f.progress()
			return fmt.Errorf("deadline: %d of %d frames, %d clients short, %d streams ended", frames, b.cfg.TailClients*events, short, ended)
		}
		f.recording.Store(false)
		h := f.latency()
		lat.Replayd = fmt.Sprintf("p50 %s, p99 %s, max %s over %d frames", ms(h.quantile(0.5)), ms(h.quantile(0.99)), ms(h.maximum()), h.count())
		return nil
	})
	if err != nil {
		lat.Replayd = "error: " + err.Error()
	}
	b.add(lat)
	if cpu.Replayd != "" {
		b.add(cpu)
	}
	return nil
}
