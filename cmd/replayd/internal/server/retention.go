package server

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/replayd/replayd"
)

// parseTopicRetention parses a --retention-topic value:
// PATTERN=LIMIT[,LIMIT], each LIMIT max-age=DURATION or max-events=N, or
// PATTERN=keep (no limit: kept whatever the default). PATTERN is a topic,
// or a prefix followed by * (the syntax of --publish-key and
// --public-topics); it is split at its first =, so a topic holding = can
// have no policy of its own. The flags' order is the match order: the
// first that matches a topic governs it.
func parseTopicRetention(s string) (replayd.TopicPolicy, error) {
	pat, limits, ok := strings.Cut(s, "=")
	if !ok || limits == "" {
		return replayd.TopicPolicy{}, fmt.Errorf("%q: want PATTERN=max-age=DURATION, PATTERN=max-events=N (both: comma-separated) or PATTERN=keep", s)
	}
	if _, err := parsePattern(pat); err != nil {
		return replayd.TopicPolicy{}, err
	}
	tp := replayd.TopicPolicy{Topic: pat}
	if limits == "keep" {
		return tp, nil
	}
	for _, l := range strings.Split(limits, ",") {
		k, v, _ := strings.Cut(l, "=")
		switch k {
		case "max-age":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return tp, fmt.Errorf("%q: max-age %q is not a positive duration", s, v)
			}
			tp.MaxAge = d
		case "max-events":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return tp, fmt.Errorf("%q: max-events %q is not a positive number", s, v)
			}
			tp.MaxEvents = n
		default:
			return tp, fmt.Errorf("%q: unknown limit %q (max-age, max-events, or keep alone)", s, l)
		}
	}
	if err := (replayd.RetentionPolicy{Topics: []replayd.TopicPolicy{tp}}).Validate(); err != nil {
		return tp, errors.Unwrap(err)
	}
	return tp, nil
}

// retentionPolicy is the policy --retention-max-age, --retention-max-events
// and --retention-topic make, and whether there is anything to prune.
func (c Config) retentionPolicy() (replayd.RetentionPolicy, bool) {
	p := replayd.RetentionPolicy{MaxAge: c.RetentionMaxAge, MaxEvents: c.RetentionMaxEvents, Topics: c.RetentionTopics}
	if p.MaxAge > 0 || p.MaxEvents > 0 {
		return p, true
	}
	for _, tp := range p.Topics {
		if tp.MaxAge > 0 || tp.MaxEvents > 0 {
			return p, true
		}
	}
	return p, false
}

// retentionInterval runs retention at least once a minute, and often
// enough for the shortest maximum age of p.
func retentionInterval(p replayd.RetentionPolicy) time.Duration {
	iv := time.Minute
	for _, maxAge := range append([]time.Duration{p.MaxAge}, topicAges(p)...) {
		if maxAge > 0 && maxAge/4 < iv {
			iv = max(maxAge/4, time.Second)
		}
	}
	return iv
}

func topicAges(p replayd.RetentionPolicy) []time.Duration {
	var out []time.Duration
	for _, tp := range p.Topics {
		out = append(out, tp.MaxAge)
	}
	return out
}
