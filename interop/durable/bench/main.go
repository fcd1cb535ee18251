// Command bench is a load generator for the Durable Streams protocol over
// HTTP: it measures any server that speaks it (replayd serve, the
// protocol's Node reference server) on the same figures, with the targets
// interleaved so each round of a phase runs every target back to back
// (a pair, or a triple) and the ratios are taken within a round.
//
//	go run ./durable/bench -target replayd=http://127.0.0.1:4440 \
//	    -target ref-file=http://127.0.0.1:4441 -target ref-mem=http://127.0.0.1:4442
//
// Each target's base URL is its root; streams live under /v1/stream/. The
// figures (every message a 1 KiB JSON object, application/json streams):
//
//   - append-1, append-64-one, append-64-distinct: POSTs a second, each
//     POST one message, from 1 writer, 64 writers on one stream, and 64
//     writers on a stream each, for -append-for.
//   - catchup: MB/s (body bytes) reading a stream of -catchup-msgs messages
//     from offset -1 to its end, following Stream-Next-Offset until
//     Stream-Up-To-Date. The stream is filled once per target (POSTs of JSON
//     arrays of 500), before the first round.
//   - longpoll: -waiters readers wait with live=long-poll at the stream's
//     tail; after -settle one message is appended; the latency is from just
//     before that POST to each reader's complete response (p50, p99, max).
//   - sse: -waiters readers follow one stream with live=sse; after -settle
//     one writer appends -sse-msgs messages, one a POST, as fast as it can;
//     the figure is messages delivered a second (readers × messages over the
//     time from the first POST to the last reader's last message).
//
// The first target is the one the ratios are of (target / each other).
// Standard library only.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type target struct{ name, url string }

type targets []target

func (t *targets) String() string { return fmt.Sprint(*t) }
func (t *targets) Set(s string) error {
	name, url, ok := strings.Cut(s, "=")
	if !ok {
		return errors.New("want NAME=URL")
	}
	*t = append(*t, target{name, strings.TrimRight(url, "/")})
	return nil
}

var (
	appendFor   = flag.Duration("append-for", 5*time.Second, "length of each append measurement")
	catchupMsgs = flag.Int("catchup-msgs", 100000, "messages in the catch-up stream")
	waiters     = flag.Int("waiters", 1000, "long-poll and SSE readers")
	sseMsgs     = flag.Int("sse-msgs", 100, "messages appended in the SSE phase")
	settle      = flag.Duration("settle", 2*time.Second, "wait after the readers' requests are sent (long-poll) or answered (SSE)")
	rounds      = flag.Int("rounds", 2, "rounds of every phase (each round runs every target back to back)")
	phasesFlag  = flag.String("phases", "append-1,append-64-one,append-64-distinct,catchup,longpoll,sse", "phases to run, in order")
	runID       = flag.String("run", fmt.Sprint(time.Now().UnixNano()), "stream name prefix (distinct per run)")
)

var client = &http.Client{Transport: &http.Transport{
	DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	MaxIdleConns:        4000,
	MaxIdleConnsPerHost: 4000,
	IdleConnTimeout:     90 * time.Second,
	DisableCompression:  true,
}, Timeout: 90 * time.Second}

// msg is a 1 KiB JSON object (1024 bytes exactly, as sent).
func msg(i int) []byte {
	head := fmt.Sprintf(`{"i":%d,"pad":"`, i)
	pad := 1024 - len(head) - 2
	return []byte(head + strings.Repeat("x", pad) + `"}`)
}

func streamURL(t target, name string) string { return t.url + "/v1/stream/" + *runID + "-" + name }

func create(u string) error {
	req, _ := http.NewRequest(http.MethodPut, u, nil)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT %s: %s", u, resp.Status)
	}
	return nil
}

func post(u string, body []byte) error {
	req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", u, resp.Status)
	}
	return nil
}

// tail is the stream's next offset (HEAD).
func tail(u string) (string, error) {
	resp, err := client.Head(u)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("HEAD %s: %s", u, resp.Status)
	}
	return resp.Header.Get("Stream-Next-Offset"), nil
}

// result is one measurement: its value and the unit it is in; higher is
// better unless lowerBetter.
type result struct {
	value       float64
	unit        string
	detail      string
	lowerBetter bool
}

type phase struct {
	name string
	prep func(t target) error // once per target, before round 1
	run  func(t target, round int) (result, error)
}

func appendPhase(name string, writers int, distinct bool) phase {
	return phase{name: name, run: func(t target, round int) (result, error) {
		urls := make([]string, writers)
		for w := range urls {
			s := fmt.Sprintf("%s-r%d", name, round)
			if distinct {
				s += fmt.Sprintf("-w%d", w)
			}
			urls[w] = streamURL(t, s)
			if w == 0 || distinct {
				if err := create(urls[w]); err != nil {
					return result{}, err
				}
			}
		}
		body := msg(0)
		var n atomic.Int64
		var firstErr error
		var once sync.Once
		deadline := time.Now().Add(*appendFor)
		start := time.Now()
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					if err := post(urls[w], body); err != nil {
						once.Do(func() { firstErr = err })
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		if firstErr != nil {
			return result{}, firstErr
		}
		return result{value: float64(n.Load()) / el.Seconds(), unit: "appends/s",
			detail: fmt.Sprintf("%d in %v", n.Load(), el.Round(time.Millisecond))}, nil
	}}
}

func catchupPhase() phase {
	return phase{name: "catchup",
		prep: func(t target) error {
			u := streamURL(t, "catchup")
			if err := create(u); err != nil {
				return err
			}
			const batch = 500
			for i := 0; i < *catchupMsgs; i += batch {
				var b bytes.Buffer
				b.WriteByte('[')
				for j := i; j < min(i+batch, *catchupMsgs); j++ {
					if j > i {
						b.WriteByte(',')
					}
					b.Write(msg(j))
				}
				b.WriteByte(']')
				if err := post(u, b.Bytes()); err != nil {
					return err
				}
			}
			return nil
		},
		run: func(t target, round int) (result, error) {
			u := streamURL(t, "catchup")
			off := "-1"
			var bytesRead, pages, msgs int64
			start := time.Now()
			for {
				resp, err := client.Get(u + "?offset=" + off)
				if err != nil {
					return result{}, err
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					return result{}, err
				}
				if resp.StatusCode != http.StatusOK {
					return result{}, fmt.Errorf("GET %s: %s", u, resp.Status)
				}
				bytesRead += int64(len(body))
				msgs += int64(bytes.Count(body, []byte(`"pad":`)))
				pages++
				next := resp.Header.Get("Stream-Next-Offset")
				if resp.Header.Get("Stream-Up-To-Date") == "true" || next == off || next == "" {
					break
				}
				off = next
			}
			el := time.Since(start)
			if msgs != int64(*catchupMsgs) {
				return result{}, fmt.Errorf("catch-up read %d messages, want %d", msgs, *catchupMsgs)
			}
			return result{value: float64(bytesRead) / 1e6 / el.Seconds(), unit: "MB/s",
				detail: fmt.Sprintf("%d msgs, %.1f MB, %d pages, %v", msgs, float64(bytesRead)/1e6, pages, el.Round(time.Millisecond))}, nil
		}}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func longpollPhase() phase {
	return phase{name: "longpoll", run: func(t target, round int) (result, error) {
		u := streamURL(t, fmt.Sprintf("longpoll-r%d", round))
		if err := create(u); err != nil {
			return result{}, err
		}
		if err := post(u, msg(0)); err != nil {
			return result{}, err
		}
		off, err := tail(u)
		if err != nil {
			return result{}, err
		}
		var t0 atomic.Int64
		lat := make([]time.Duration, *waiters)
		errs := make([]error, *waiters)
		var wg sync.WaitGroup
		for r := range *waiters {
			wg.Go(func() {
				resp, err := client.Get(u + "?offset=" + off + "&live=long-poll")
				if err != nil {
					errs[r] = err
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				end := time.Now().UnixNano()
				if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"pad":`)) {
					errs[r] = fmt.Errorf("long poll: %s %v %q", resp.Status, err, body[:min(len(body), 80)])
					return
				}
				lat[r] = time.Duration(end - t0.Load())
			})
		}
		time.Sleep(*settle) // the server gives no signal that a poll is waiting
		t0.Store(time.Now().UnixNano())
		if err := post(u, msg(1)); err != nil {
			return result{}, err
		}
		wg.Wait()
		if n := countErr(errs); n > 0 {
			return result{}, fmt.Errorf("%d readers failed, first: %v", n, firstErr(errs))
		}
		slices.Sort(lat)
		p50, p99 := percentile(lat, .50), percentile(lat, .99)
		return result{value: float64(p99) / 1e6, unit: "ms p99", lowerBetter: true,
			detail: fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms", float64(p50)/1e6, float64(p99)/1e6, float64(lat[len(lat)-1])/1e6)}, nil
	}}
}

func countErr(errs []error) int {
	n := 0
	for _, e := range errs {
		if e != nil {
			n++
		}
	}
	return n
}

func ssePhase() phase {
	return phase{name: "sse", run: func(t target, round int) (result, error) {
		u := streamURL(t, fmt.Sprintf("sse-r%d", round))
		if err := create(u); err != nil {
			return result{}, err
		}
		if err := post(u, msg(-1)); err != nil {
			return result{}, err
		}
		off, err := tail(u)
		if err != nil {
			return result{}, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		want := *sseMsgs
		var connected, done sync.WaitGroup
		var lastNano atomic.Int64
		var delivered atomic.Int64
		errs := make([]error, *waiters)
		connected.Add(*waiters)
		done.Add(*waiters)
		for r := range *waiters {
			go func() {
				defer done.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"?offset="+off+"&live=sse", nil)
				req.Header.Set("Accept", "text/event-stream")
				resp, err := client.Do(req)
				connected.Done()
				if err != nil {
					errs[r] = err
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs[r] = fmt.Errorf("sse: %s", resp.Status)
					return
				}
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 1<<16), 1<<24)
				got := 0
				for sc.Scan() {
					line := sc.Bytes()
					if !bytes.HasPrefix(line, []byte("data:")) {
						continue
					}
					n := bytes.Count(line, []byte(`"pad":`))
					got += n
					delivered.Add(int64(n))
					if got >= want {
						now := time.Now().UnixNano()
						for {
							old := lastNano.Load()
							if now <= old || lastNano.CompareAndSwap(old, now) {
								break
							}
						}
						return
					}
				}
				errs[r] = fmt.Errorf("sse: stream ended after %d of %d messages: %v", got, want, sc.Err())
			}()
		}
		connected.Wait()
		time.Sleep(*settle)
		start := time.Now()
		for i := range want {
			if err := post(u, msg(i)); err != nil {
				cancel()
				done.Wait()
				return result{}, err
			}
		}
		postEl := time.Since(start)
		done.Wait()
		if n := countErr(errs); n > 0 {
			if ctx.Err() == nil || delivered.Load() == 0 {
				return result{}, fmt.Errorf("%d readers failed, first: %v", n, firstErr(errs))
			}
			// Cut off at the deadline: what was delivered by then is
			// the figure (an upper bound on the server's rate).
			el := time.Since(start)
			return result{value: float64(delivered.Load()) / el.Seconds(), unit: "msgs/s",
				detail: fmt.Sprintf("INCOMPLETE: %d readers unfinished at the 60 s deadline; %d of %d delivered in %v (posts took %v)",
					n, delivered.Load(), *waiters*want, el.Round(time.Millisecond), postEl.Round(time.Millisecond))}, nil
		}
		el := time.Duration(lastNano.Load() - start.UnixNano())
		return result{value: float64(delivered.Load()) / el.Seconds(), unit: "msgs/s",
			detail: fmt.Sprintf("%d delivered in %v (posts took %v)", delivered.Load(), el.Round(time.Millisecond), postEl.Round(time.Millisecond))}, nil
	}}
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func main() {
	var ts targets
	flag.Var(&ts, "target", "NAME=URL of a server's root (repeat; the first is the one ratios are of)")
	flag.Parse()
	if len(ts) == 0 {
		fmt.Fprintln(os.Stderr, "bench: no -target")
		os.Exit(2)
	}
	all := map[string]phase{}
	for _, p := range []phase{
		appendPhase("append-1", 1, false),
		appendPhase("append-64-one", 64, false),
		appendPhase("append-64-distinct", 64, true),
		catchupPhase(), longpollPhase(), ssePhase(),
	} {
		all[p.name] = p
	}
	failed := false
	for _, name := range strings.Split(*phasesFlag, ",") {
		p, ok := all[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "bench: no phase %q\n", name)
			os.Exit(2)
		}
		if p.prep != nil {
			for _, t := range ts {
				start := time.Now()
				if err := p.prep(t); err != nil {
					fmt.Printf("%-19s %-9s prep FAILED: %v\n", p.name, t.name, err)
					failed = true
				} else {
					fmt.Printf("%-19s %-9s prep %v\n", p.name, t.name, time.Since(start).Round(time.Millisecond))
				}
			}
		}
		for round := 1; round <= *rounds; round++ {
			res := make([]result, len(ts))
			ok := make([]bool, len(ts))
			for i, t := range ts {
				r, err := p.run(t, round)
				if err != nil {
					fmt.Printf("%-19s r%d %-9s FAILED: %v\n", p.name, round, t.name, err)
					failed = true
					continue
				}
				res[i], ok[i] = r, true
				fmt.Printf("%-19s r%d %-9s %10.1f %-9s (%s)\n", p.name, round, t.name, r.value, r.unit, r.detail)
			}
			for i := 1; i < len(ts); i++ {
				if !ok[0] || !ok[i] || res[i].value == 0 || res[0].value == 0 {
					continue
				}
				ratio := res[0].value / res[i].value
				if res[0].lowerBetter {
					ratio = res[i].value / res[0].value
				}
				fmt.Printf("%-19s r%d ratio %s/%s: %.2fx (higher is better for %s)\n", p.name, round, ts[0].name, ts[i].name, ratio, ts[0].name)
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}
