package server

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/replayd/replayd"
)

var errNoPublishKey = fmt.Errorf("no publish key: %w", replayd.ErrUnauthenticated)

// streamsOptions are the Durable Streams handler's: writes need a publish
// key whose patterns cover the stream's topic (401 without a key, 403 for
// one that does not cover it); reads go through the hub's Authorize
// (tokens, --public-topics). --streams-dev opens both.
func streamsOptions(c Config, log *slog.Logger) replayd.DurableStreamsOptions {
	opts := replayd.DurableStreamsOptions{Prefix: c.StreamsPrefix, MaxBody: c.MaxBody}
	if c.StreamsDev {
		opts.Open = true
		opts.AuthorizeRead = func(*http.Request, string) error { return nil }
		return opts
	}
	keys := publishKeys(c.PublishKeys)
	opts.AuthorizeWrite = func(r *http.Request, topic string) error {
		pats, ok := keys.lookup(r)
		if !ok {
			log.Info("stream write refused", "code", "key_missing", "topic", topic, "remote", r.RemoteAddr)
			return errNoPublishKey
		}
		if len(pats) > 0 && !pats.Match(topic) {
			log.Info("stream write refused", "code", "topic_not_covered", "topic", topic, "remote", r.RemoteAddr)
			return errForbidden
		}
		return nil
	}
	return opts
}
