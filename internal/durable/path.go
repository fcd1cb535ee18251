package durable

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/replayd/replayd/internal/event"
)

// maxTopicLen bounds a stream's name as Publish bounds a topic.
const maxTopicLen = 256

var errBadPath = errors.New("bad stream path")

// topicOf maps a request path under prefix to the stream's topic: the
// path after the prefix, as net/http decoded it. It refuses what could
// name something other than what the client wrote (an encoded slash, dot
// segments, empty segments) and what Publish refuses.
func (h *Handler) topicOf(r *http.Request) (string, error) {
	if r.URL.RawPath != "" && strings.Contains(strings.ToLower(r.URL.RawPath), "%2f") {
		return "", errors.New("an encoded '/' in a stream path is not allowed")
	}
	return h.topicFromPath(r.URL.Path)
}

// topicFromHeader maps a path as a client writes it in a URL, percent-
// encoded (a Stream-Forked-From value), to a topic, as topicOf maps a
// request's: an encoded '/' is refused.
func (h *Handler) topicFromHeader(raw string) (string, error) {
	if strings.Contains(strings.ToLower(raw), "%2f") {
		return "", errBadPath
	}
	path, err := url.PathUnescape(raw)
	if err != nil {
		return "", errBadPath
	}
	return h.topicFromPath(path)
}

// topicFromPath maps a decoded path to a topic.
func (h *Handler) topicFromPath(path string) (string, error) {
	name, ok := strings.CutPrefix(path, h.prefix)
	if !ok || name == "" {
		return "", errBadPath
	}
	if len(name) > maxTopicLen || !utf8.ValidString(name) || strings.HasSuffix(name, "/") {
		return "", errBadPath
	}
	for seg := range strings.SplitSeq(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", errBadPath
		}
	}
	topic := h.topicPrefix + name
	if err := event.ValidateTopic(topic); err != nil {
		return "", err
	}
	return topic, nil
}
