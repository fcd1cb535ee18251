package server

import (
	"errors"
	"fmt"
	"strings"
)

// A Pattern names topics: an exact topic, a prefix ending in * ("room-*"),
// or * alone (every topic, and the global scope and broadcasts).
type Pattern string

// Patterns is a list of patterns; a topic matches the list if it matches
// any of them.
type Patterns []Pattern

// ParsePatterns parses a comma-separated list of patterns.
func ParsePatterns(s string) (Patterns, error) {
	var ps Patterns
	for _, f := range strings.Split(s, ",") {
		p, err := parsePattern(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func parsePattern(s string) (Pattern, error) {
	switch {
	case s == "":
		return "", errors.New("empty pattern")
	case strings.Contains(strings.TrimSuffix(s, "*"), "*"):
		return "", fmt.Errorf("pattern %q: * may only end a pattern", s)
	}
	return Pattern(s), nil
}

// Match reports whether p covers topic; "" (a broadcast, or the global
// scope) is covered by * alone.
func (p Pattern) Match(topic string) bool {
	switch {
	case p == "*":
		return true
	case topic == "":
		return false
	case strings.HasSuffix(string(p), "*"):
		return strings.HasPrefix(topic, string(p[:len(p)-1]))
	}
	return string(p) == topic
}

// Match reports whether any pattern of ps covers topic.
func (ps Patterns) Match(topic string) bool {
	for _, p := range ps {
		if p.Match(topic) {
			return true
		}
	}
	return false
}
