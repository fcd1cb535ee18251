package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The harness spawns its own executable as the server; under `go test`
	// that is this test binary, which must then act as the server.
	if code, ran := runChild(); ran {
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}

// TestHarnessTiny runs every phase at tiny sizes: the harness works end to
// end, across processes, and cleans up after itself. Its figures are not
// checked; a machine under -race and load proves nothing about targets.
func TestHarnessTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns server processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	start := time.Now()
	if err := run(ctx, []string{"-size", "tiny"}, &out, &errOut); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("tiny run took %v:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	for _, want := range []string{"publish, 1 publisher", "fan-out, 5 clients", "latency, 5 clients", "memory per idle connection", "DetachConnections", "c100k, 20 connections", "reconnect storm", "cross-process tail latency", "tail CPU while idle", "c100k-multi, 400 connections (2 server + 2 client processes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	checkExtraRows(t, out.String())
	if strings.Contains(out.String(), "error:") {
		t.Errorf("a measurement failed:\n%s", out.String())
	}
}

func TestHistogram(t *testing.T) {
	var h histogram
	var vs []uint64
	for v := uint64(1); v <= 100000; v++ {
		vs = append(vs, v)
	}
	h.addAll(vs)
	for _, c := range []struct {
		q    float64
		want uint64
	}{{0.5, 50000}, {0.99, 99000}, {1, 100000}} {
		got := h.quantile(c.q)
		if got < c.want || float64(got) > float64(c.want)*1.01 {
			t.Errorf("quantile(%v) = %d, want %d within 1%%", c.q, got, c.want)
		}
	}
	for _, v := range []uint64{0, 1, 127, 128, 255, 256, 1 << 20, 1<<63 + 12345} {
		if i := bucketOf(v); bucketTop(i) < v || (i > 0 && bucketTop(i-1) >= v) {
			t.Errorf("value %d in bucket %d [%d, %d]", v, i, bucketTop(i-1)+1, bucketTop(i))
		}
	}
}
