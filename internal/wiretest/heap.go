package wiretest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// heapInUseMetrics are the two runtime/metrics classes whose sum is
// runtime.MemStats.HeapInuse: the heap's objects (live, and dead but not
// yet swept) and the free space in its in-use spans. Reading them does not
// stop the world, as ReadMemStats does, so they can be sampled often.
var heapInUseMetrics = []string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes"}

func readHeapInUse(samples []metrics.Sample) uint64 {
	metrics.Read(samples)
	var n uint64
	for _, s := range samples {
		n += s.Value.Uint64()
	}
	return n
}

// PeakHeap runs fn and returns how far the heap in use (HeapInuse: garbage
// not yet collected counts, as it holds memory) rose above its level
// before fn, at most: the baseline is taken after a collection, and a
// goroutine samples the heap every 200µs while fn runs (and once after).
// It is what a request holds at its worst, whatever it frees afterwards.
func PeakHeap(fn func()) (baseline, peak uint64) {
	samples := make([]metrics.Sample, len(heapInUseMetrics))
	for i, name := range heapInUseMetrics {
		samples[i].Name = name
	}
	runtime.GC()
	baseline = readHeapInUse(samples)
	var (
		highest uint64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		own := make([]metrics.Sample, len(samples))
		copy(own, samples)
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			highest = max(highest, readHeapInUse(own))
			select {
			case <-stop:
				highest = max(highest, readHeapInUse(own))
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(stop)
	wg.Wait()
	return baseline, highest - min(highest, baseline)
}

// MiB formats a byte count in MiB.
func MiB(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// LargePoll is one poll answer read by GetLargePoll.
type LargePoll struct {
	Status int
	Header http.Header
	Size   int64  // the body's length
	Body   []byte // the body, if it was at most the keep bound; else nil
}

// GetLargePoll sends one poll request to base's /poll and reads its body
// as it arrives, keeping at most keep bytes of it (an answer over that is
// counted, not held, so that the client's own memory stays small while a
// test measures the server's): the status, the headers, the size and, if
// it fit, the body. It returns an error rather than failing the test, so
// that it can run on any goroutine; the request ends within 2×WaitFor.
func GetLargePoll(base, query string, keep int64) (LargePoll, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*WaitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/poll?"+query, nil)
	if err != nil {
		return LargePoll{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return LargePoll{}, err
	}
	defer resp.Body.Close()
	p := LargePoll{Status: resp.StatusCode, Header: resp.Header}
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if p.Size+int64(n) <= keep {
				p.Body = append(p.Body, buf[:n]...)
			} else {
				p.Body = nil
			}
			p.Size += int64(n)
		}
		if err == io.EOF {
			return p, nil
		}
		if err != nil {
			return p, fmt.Errorf("poll %s: read the body after %d bytes: %w", query, p.Size, err)
		}
	}
}
