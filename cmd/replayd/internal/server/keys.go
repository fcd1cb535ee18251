package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"
)

// A PublishKey may publish to the topics its patterns cover.
type PublishKey struct {
	hash     [sha256.Size]byte // of the key: compared in constant time
	Patterns Patterns
}

// parsePublishKey parses KEY or KEY=PATTERN[,PATTERN...]; a bare key may
// publish everywhere.
func parsePublishKey(s string) (PublishKey, error) {
	key, pats, found := strings.Cut(s, "=")
	if key == "" {
		return PublishKey{}, errors.New("empty key")
	}
	if strings.ContainsAny(key, " \t\r\n") {
		return PublishKey{}, errors.New("a key holds no white space")
	}
	pk := PublishKey{hash: sha256.Sum256([]byte(key)), Patterns: Patterns{"*"}}
	if found {
		p, err := ParsePatterns(pats)
		if err != nil {
			return PublishKey{}, err
		}
		pk.Patterns = p
	}
	return pk, nil
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
