package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestLatencyFlags runs the latency phase with its client count, topics
// and rates from flags: 6 clients over 3 topics, each topic at 100
// events/s, on both servers, every client getting every event of its
// topic (an incomplete run would say INCOMPLETE; a gap fails the row).
func TestLatencyFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns server processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	args := []string{"-size", "tiny", "-phases", "latency", "-lat-clients", "6", "-lat-topics", "3", "-lat-rates", "100"}
	if err := run(ctx, args, &out, &errOut); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("%s", out.String())
	if !strings.Contains(out.String(), "latency, 6 clients over 3 topics × 100 events/s") {
		t.Errorf("table lacks the 6-client, 3-topic latency row")
	}
	for _, bad := range []string{"error:", "INCOMPLETE"} {
		if strings.Contains(out.String(), bad) {
			t.Errorf("table has %q:\n%s", bad, out.String())
		}
	}
	if !strings.Contains(out.String(), "published 300/s") {
		t.Errorf("hub or raw did not publish 3 × 100 events/s:\n%s", out.String())
	}
}

func TestLatencyFlagsRefused(t *testing.T) {
	for _, args := range [][]string{{"-lat-topics", "0"}, {"-lat-rates", "100,x"}, {"-lat-rates", "-5"}} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), append([]string{"-size", "tiny", "-phases", "latency"}, args...), &out, &errOut); err == nil || !strings.Contains(err.Error(), "bad -lat-") {
			t.Errorf("run %v: err %v, want a bad -lat- flag", args, err)
		}
	}
}
