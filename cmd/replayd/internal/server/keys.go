package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// A PublishKey may publish to the topics its patterns cover.
type PublishKey struct {
	hash     [sha256.Size]byte // of the key: compared in constant time
	Patterns Patterns
	short    bool // under minKeyLen bytes: the server warns at start
}

// minKeyLen is the shortest publish key the server starts with no warning.
const minKeyLen = 16

// parsePublishKey parses KEY or KEY=PATTERN[,PATTERN...]; a bare key may
// publish everywhere. The form is split at the last =, so a key may end in
// = (base64 padding) when its patterns follow ("c2VjcmV0==*"); patterns
// hold no =. A form that could be read two ways is refused rather than
// guessed: a value ending in = (a padded key alone, or a key with an empty
// pattern), or a key with = anywhere but at its end.
func parsePublishKey(s string) (PublishKey, error) {
	i := strings.LastIndexByte(s, '=')
	key, pats := s, ""
	if i >= 0 {
		key, pats = s[:i], s[i+1:]
	}
	switch {
	case i == len(s)-1 && strings.TrimRight(s, "=") != "":
		return PublishKey{}, errors.New("ends in =: a key ending in = (base64 padding) needs its patterns after one more = (KEY=* to publish anywhere), or give it in --publish-key-file; or use a key without =, such as openssl rand -hex 32 makes")
	case strings.TrimRight(key, "=") == "":
		return PublishKey{}, errors.New("empty key")
	case strings.Contains(strings.TrimRight(key, "="), "="):
		return PublishKey{}, errors.New("ambiguous: KEY=PATTERN is split at the last =, and a key may hold = only at its end (base64 padding), a pattern not at all; --publish-key-file takes any key and pattern")
	case strings.ContainsAny(key, " \t\r\n"):
		return PublishKey{}, errors.New("a key holds no white space")
	}
	if i < 0 {
		return newPublishKey(key, Patterns{"*"}), nil
	}
	p, err := ParsePatterns(pats)
	if err != nil {
		return PublishKey{}, err
	}
	return newPublishKey(key, p), nil
}

func newPublishKey(key string, p Patterns) PublishKey {
	return PublishKey{hash: sha256.Sum256([]byte(key)), Patterns: p, short: len(key) < minKeyLen}
}

// parsePublishKeyFile parses the lines of a --publish-key-file: KEY alone
// (publishes anywhere) or KEY, white space, PATTERN[,PATTERN...]; blank
// lines and lines starting with # are skipped. A key ends at the first
// white space, so it may hold any other byte, = included. Errors name the
// line, never the key.
func parsePublishKeyFile(text string) ([]PublishKey, error) {
	var keys []PublishKey
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, ps := line, Patterns{"*"}
		if i := strings.IndexAny(line, " \t"); i >= 0 {
			key = line[:i]
			p, err := ParsePatterns(strings.TrimSpace(line[i+1:]))
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", n+1, err)
			}
			ps = p
		}
		keys = append(keys, newPublishKey(key, ps))
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in it")
	}
	return keys, nil
}

// publishKeys finds the key a request presents, comparing it with every
// configured key in constant time.
type publishKeys []PublishKey

// lookup returns the patterns of the key r presents as a Bearer token, or
// false when it presents none or an unknown one.
func (ks publishKeys) lookup(r *http.Request) (Patterns, bool) {
	tok, ok := bearer(r)
	if !ok {
		return nil, false
	}
	h := sha256.Sum256([]byte(tok))
	var found Patterns
	match := 0
	for _, k := range ks {
		if subtle.ConstantTimeCompare(h[:], k.hash[:]) == 1 {
			found, match = append(found, k.Patterns...), 1
		}
	}
	return found, match == 1
}

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}
