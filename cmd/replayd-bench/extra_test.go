package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestHarnessTinyExtra runs the multitopic and poll phases at tiny sizes:
// their rows are in the table and none failed.
func TestHarnessTinyExtra(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns server processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"-size", "tiny", "-phases", "multitopic,pollwait,pollrate"}, &out, &errOut); err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("\n%s", out.String())
	for _, want := range []string{
		"fan-out, 5 clients × 4 topics, topic events", "fan-out, 5 clients × 4 topics, broadcasts",
		"20 waiting long polls on one topic", "memory per waiting long poll", "poll throughput, 4 clients",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "error:") {
		t.Errorf("a measurement failed:\n%s", out.String())
	}
}

func TestAnswerParsing(t *testing.T) {
	body := []byte(`{"topics":["p"],"cursor":42,"head":50,"more":true,"gap":null,"events":[` +
		`{"id":41,"type":"message","topic":"p","data":{"t":1,"order":{"id":"ord_1"}}},` +
		`{"id":42,"type":"message","topic":null,"data":{"id":"x7"}}]}`)
	if c, ok := answerCursor(body); !ok || c != 42 {
		t.Errorf("answerCursor = %d, %v; want 42", c, ok)
	}
	// The payloads' own "id" keys hold strings: not events.
	if n := answerEvents(body); n != 2 {
		t.Errorf("answerEvents = %d; want 2", n)
	}
}
