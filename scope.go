package replayd

import (
	"net/url"
	"slices"
	"strings"
)

// parseTopics returns the scope a request names with the param query
// parameter: its values trimmed, blanks dropped, each topic once, in
// the order first given. None left is the global scope (nil). An invalid
// topic, or more than maxTopics distinct ones, is an error wrapping
// ErrInvalid. The query must come from url.ParseQuery with its error
// checked: url.Values from a query that does not parse lacks the malformed
// pairs, and a dropped topic would widen the scope.
func parseTopics(query url.Values, param string, maxTopics int) ([]string, error) {
	var topics []string
	for _, v := range query[param] {
		t := strings.TrimSpace(v)
		if t == "" || slices.Contains(topics, t) {
			continue
		}
		if err := validateTopic(t); err != nil {
			return nil, err
		}
		if len(topics) == maxTopics {
			return nil, invalidf("more than %d topics", maxTopics)
		}
		topics = append(topics, t)
	}
	return topics, nil
}
