package hubtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayd/replayd"
)

// JobsCostResult is what JobsCost measured.
type JobsCostResult struct {
	Jobs, Tokens   int           // jobs run; tokens written in the measured window
	Window         time.Duration // the measured window (every job streaming)
	CommitsPerSec  float64       // the node's store commits per second in the window
	P50, P99, Max  time.Duration // token-to-reader latency of the window's tokens
	TargetMet      bool          // p99 <= 100 ms and commits/s <= 20
	TokensPerJobPS float64       // tokens written per job per second (the pace)
}

// JobsCost measures what job streams cost (issue 29, item 3) on a hub
// over store: jobs concurrent jobs (replayd.Jobs with its defaults), each
// upstream writing one token of a few bytes every 20 ms (50 tokens/s) for
// d; a reader follows each job live, by an SSE stream of Handler() on the
// job's topic over real HTTP, opened before the job starts. For every
// token it records the time from its WriteString to the reader reading
// the message that holds it; commits counts the node's store commits (a
// counting wrapper around the store, the caller's). The window measured
// starts 2 s after the last start and ends 2 s before the first job's end
// (the starts' and ends' commits are not in it). It checks that every
// reader got each of its job's tokens exactly once, in order, then the
// end; it logs the figures and returns them. A backend's test runs it on
// request only, e.g.
//
//	REPLAYD_JOBS_COST=1 go test -run '^TestJobsCost$' -v -timeout 10m .
//
// It skips unless REPLAYD_JOBS_COST is set; REPLAYD_JOBS_COST_JOBS=N
// runs N jobs instead of jobs (to vary the setup). The hub is on store,
// closed at the end of the test.
func JobsCost(t *testing.T, store replayd.Store, commits func() int64, jobs int, d time.Duration) JobsCostResult {
	if os.Getenv("REPLAYD_JOBS_COST") == "" {
		t.Skip("set REPLAYD_JOBS_COST=1 to measure job streams' cost")
	}
	const every = 20 * time.Millisecond
	if n, err := strconv.Atoi(os.Getenv("REPLAYD_JOBS_COST_JOBS")); err == nil && n > 0 {
		jobs = n
	}
	tokens := int(d / every)
	h, err := replayd.NewWithStore(store, replayd.Options{SSE: replayd.SSEOptions{MaxConnections: 4 * jobs}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	j, err := h.Jobs(replayd.JobsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d+2*time.Minute)
	defer cancel()

	// written[i][k]: when job i's token k was written (Unix ns).
	written := make([][]atomic.Int64, jobs)
	var mu sync.Mutex
	var lat []time.Duration // the window's tokens'
	var winFrom, winTo atomic.Int64
	var ready, readers sync.WaitGroup
	run := fmt.Sprint(time.Now().UnixNano())
	for i := range jobs {
		written[i] = make([]atomic.Int64, tokens)
		ready.Add(1)
		readers.Add(1)
		go func() {
			defer readers.Done()
			id := fmt.Sprintf("cost-%s-%d", run, i)
			req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"?topic="+url.QueryEscape(j.Topic(id)), nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				ready.Done()
				t.Errorf("reader %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			hello, next := true, 0
			var mine []time.Duration
			for sc.Scan() {
				line := sc.Text()
				if hello {
					if line == "" {
						hello = false
						ready.Done()
					}
					continue
				}
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok {
					continue
				}
				var m struct{ K, T string }
				if json.Unmarshal([]byte(data), &m) != nil {
					continue
				}
				now := time.Now().UnixNano()
				if m.K == "end" {
					break
				}
				if m.K != "text" {
					continue
				}
				for _, tok := range strings.Split(strings.TrimSuffix(m.T, ","), ",") {
					k, err := strconv.Atoi(tok)
					if err != nil || k != next {
						t.Errorf("job %d: token %q, want %d", i, tok, next)
						return
					}
					next++
					w := written[i][k].Load()
					if w >= winFrom.Load() && w < winTo.Load() {
						mine = append(mine, time.Duration(now-w))
					}
				}
			}
			if next != tokens {
				t.Errorf("job %d: the reader got %d tokens of %d", i, next, tokens)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	ready.Wait()

	// The jobs: started one after another, each writing a token every 20 ms.
	winFrom.Store(math.MaxInt64)
	winTo.Store(math.MaxInt64)
	var first time.Time
	for i := range jobs {
		id := fmt.Sprintf("cost-%s-%d", run, i)
		if _, _, err := j.Start(ctx, id, func(ctx context.Context, w *replayd.JobWriter) (any, error) {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for k := range tokens {
				written[i][k].Store(time.Now().UnixNano())
				if _, err := w.WriteString(strconv.Itoa(k) + ","); err != nil {
					return nil, err
				}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-tick.C:
				}
			}
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = time.Now()
		}
	}
	from := time.Now().Add(2 * time.Second)
	to := first.Add(d - 2*time.Second)
	if !to.After(from) {
		t.Fatalf("%v is too short a run for %d jobs to start and be measured", d, jobs)
	}
	winFrom.Store(from.UnixNano())
	winTo.Store(to.UnixNano())
	time.Sleep(time.Until(from)) // the window's start
	c0 := commits()
	time.Sleep(time.Until(to)) // the window's end
	c1 := commits()
	readers.Wait()

	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(math.Ceil(p*float64(len(lat))))-1)]
	}
	slices.Sort(lat)
	r := JobsCostResult{Jobs: jobs, Tokens: len(lat), Window: to.Sub(from),
		CommitsPerSec: float64(c1-c0) / to.Sub(from).Seconds(), P50: q(.5), P99: q(.99), Max: q(1),
		TokensPerJobPS: float64(time.Second / every)}
	r.TargetMet = r.P99 <= 100*time.Millisecond && r.CommitsPerSec <= 20
	t.Logf("%d jobs × %.0f tokens/s for %v; window %v: %.1f commits/s; %d tokens, token-to-reader p50 %v p99 %v max %v; target (p99 ≤ 100ms, ≤ 20 commits/s) met: %v",
		jobs, r.TokensPerJobPS, d, r.Window.Round(time.Millisecond), r.CommitsPerSec, r.Tokens,
		r.P50.Round(100*time.Microsecond), r.P99.Round(100*time.Microsecond), r.Max.Round(100*time.Microsecond), r.TargetMet)
	return r
}
