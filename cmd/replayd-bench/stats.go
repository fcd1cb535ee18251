package main

import (
	"bufio"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// histogram records durations in microseconds with < 1% relative error:
// exact below 128 µs, then 128 buckets per power of two.
type histogram struct {
	mu     sync.Mutex
	counts [128 + 57*128]uint64
	n      uint64
	max    uint64
}

func bucketOf(v uint64) int {
	if v < 128 {
		return int(v)
	}
	s := bits.Len64(v) - 8 // v>>s is in [128, 256)
	return 128 + s*128 + int(v>>uint(s)) - 128
}

// bucketTop is the largest value in bucket i: percentiles never flatter.
func bucketTop(i int) uint64 {
	if i < 128 {
		return uint64(i)
	}
	s := (i - 128) / 128
	m := uint64((i-128)%128 + 128)
	return (m+1)<<uint(s) - 1
}

// addAll records vs (µs) under one lock.
func (h *histogram) addAll(vs []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, v := range vs {
		h.counts[bucketOf(v)]++
		h.max = max(h.max, v)
	}
	h.n += uint64(len(vs))
}

func (h *histogram) merge(o *histogram) {
	o.mu.Lock()
	defer o.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the q-quantile (0 < q ≤ 1) in µs.
func (h *histogram) quantile(q float64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(bucketTop(i), h.max)
		}
	}
	return h.max
}

func (h *histogram) count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func (h *histogram) maximum() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.max
}

// procStats is a process's resource figures, as the server reports them.
type procStats struct {
	RSSKiB     int64 `json:"rssKiB"`     // VmRSS from /proc/self/status
	CPUNanos   int64 `json:"cpuNanos"`   // user + system, getrusage
	SysNanos   int64 `json:"sysNanos"`   // system (the kernel, for the process), getrusage
	Goroutines int   `json:"goroutines"` // runtime.NumGoroutine
	HeapInuse  int64 `json:"heapInuse"`  // runtime.MemStats.HeapInuse
	StackInuse int64 `json:"stackInuse"` // runtime.MemStats.StackInuse
	Clients    int   `json:"clients"`    // open SSE streams
}

// rssKiB reads VmRSS from /proc/self/status.
func rssKiB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return -1
}

// cpuTimes is the process's user and system CPU time so far.
func cpuTimes() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// raiseFileLimit lifts RLIMIT_NOFILE's soft limit to its hard limit: the
// phases open thousands of sockets on each side.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}
