package main

import (
	"strings"
	"testing"
)

// checkExtraRows checks, for TestHarnessTiny, that the tiny run's table
// has the rows of the multitopic and poll phases.
func checkExtraRows(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{
		"fan-out, 5 clients × 4 topics, topic events", "fan-out, 5 clients × 4 topics, broadcasts",
		"20 waiting long polls on one topic", "memory per waiting long poll", "poll throughput, 4 clients",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
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
