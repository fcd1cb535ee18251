package replaydmcp

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/replayd/replayd/storage"
)

// How the SDK's streams map onto the log. Every row this package writes is
// one of these, told apart by its type:
//
//   - typeSessionOpen, on the session's topic, once per stream opened (its
//     event id, openID, names the stream, and makes a second write a
//     no-op): the session and the stream exist.
//   - typeSessionClosed, on the session's topic: SessionClosed ran.
//   - typeText or typeBytes, on the stream's topic: the data of one Append,
//     with the stream index in its event id. Nothing else is on that
//     topic, so its prune watermark tells whether data of it was pruned.
//
// Topics are hashes, so that any session and stream id (any bytes, any
// length) fits any backend's topic column, and one session's topic never
// names another's. Event ids carry the topic, so they are unique in the log,
// and an append racing another process's for the same index is refused by
// the log as a duplicate instead of stored twice.
const (
	typeSessionOpen   = "mcp-session"
	typeSessionClosed = "mcp-session-closed"
	typeText          = "mcp"     // payload: the data, as is
	typeBytes         = "mcp-b64" // payload: a JSON string, the data in base64
)

// sessionTopic is the topic of a session's markers.
func sessionTopic(sessionID string) string {
	h := sha256.Sum256([]byte("session\x00" + sessionID))
	return "mcp.s." + hex.EncodeToString(h[:16])
}

// streamTopic is the topic of a stream's marker and data. The session id's
// length prefixes it, so no two (session, stream) pairs share a topic.
func streamTopic(sessionID, streamID string) string {
	h := sha256.Sum256([]byte("stream\x00" + strconv.Itoa(len(sessionID)) + "\x00" + sessionID + "\x00" + streamID))
	return "mcp.t." + hex.EncodeToString(h[:16])
}

// openID is the event id of the record that a stream was opened.
func openID(sessionTopic, streamTopic string) string {
	return "open/" + sessionTopic + "/" + streamTopic
}

// dataID is the event id of the data at index idx of the stream whose
// topic is topic.
func dataID(topic string, idx int) string { return topic + "/" + strconv.Itoa(idx) }

// dataIndex parses the index out of a data row's event id.
func dataIndex(ev storage.Event) (int, error) {
	i := strings.LastIndexByte(ev.EventID, '/')
	if i < 0 {
		return 0, fmt.Errorf("replaydmcp: event %q of topic %s: no index in its id", ev.EventID, ev.Topic)
	}
	idx, err := strconv.Atoi(ev.EventID[i+1:])
	if err != nil || idx < 0 {
		return 0, fmt.Errorf("replaydmcp: event %q of topic %s: bad index in its id", ev.EventID, ev.Topic)
	}
	return idx, nil
}

// encodeData returns the type and payload storing data byte for byte. Text
// every backend stores as is (valid UTF-8, no NUL, not empty: the SDK's
// JSON-RPC messages) is stored as is; anything else (the SDK's empty
// priming data) in base64.
func encodeData(data []byte) (typ string, payload json.RawMessage) {
	if len(data) > 0 && utf8.Valid(data) && bytes.IndexByte(data, 0) < 0 {
		return typeText, json.RawMessage(data)
	}
	b, _ := json.Marshal(base64.StdEncoding.EncodeToString(data))
	return typeBytes, b
}

// decodeData inverts encodeData.
func decodeData(ev storage.Event) ([]byte, error) {
	switch ev.Type {
	case typeText:
		return []byte(ev.Payload), nil
	case typeBytes:
		var s string
		if err := json.Unmarshal(ev.Payload, &s); err != nil {
			return nil, fmt.Errorf("replaydmcp: event %q: %w", ev.EventID, err)
		}
		return base64.StdEncoding.DecodeString(s)
	}
	return nil, errors.New("replaydmcp: not a data event: " + ev.Type)
}

// isData reports whether ev holds the data of an Append.
func isData(ev storage.Event) bool { return ev.Type == typeText || ev.Type == typeBytes }
