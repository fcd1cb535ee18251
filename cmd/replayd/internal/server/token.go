package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/replayd/replayd"
)

// Subscriber tokens are JWTs whose topics claim lists the patterns the
// bearer may read. A token is taken from the Authorization header, else the
// access_token query parameter (an EventSource cannot set headers), else
// the replayd_token cookie.

const (
	tokenParam  = "access_token"
	tokenCookie = "replayd_token"
)

// minSecret is the shortest HS256 secret accepted: 256 bits.
const minSecret = 32

// tokenClaims are the claims a subscriber token carries.
type tokenClaims struct {
	Topics Patterns `json:"topics"`
	jwt.RegisteredClaims
}

// verifier checks subscriber tokens against one key.
type verifier struct {
	key    any
	parser *jwt.Parser
}

// loadVerifier reads the key file: a PEM public key (RSA, ECDSA or
// Ed25519), or else an HS256 secret (the file's bytes, without trailing
// white space).
func loadVerifier(c Config) (*verifier, error) {
	b, err := os.ReadFile(c.TokenKeyFile)
	if err != nil {
		return nil, err
	}
	v := &verifier{}
	var methods []string
	if blk, _ := pem.Decode(b); blk != nil {
		pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: not a PEM public key (PKIX): %v", c.TokenKeyFile, err)
		}
		switch pub.(type) {
		case *rsa.PublicKey:
			methods = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
		case *ecdsa.PublicKey:
			methods = []string{"ES256", "ES384", "ES512"}
		case ed25519.PublicKey:
			methods = []string{"EdDSA"}
		default:
			return nil, fmt.Errorf("%s: unsupported public key type %T", c.TokenKeyFile, pub)
		}
		v.key = pub
	} else {
		secret := bytes.TrimRight(b, " \t\r\n")
		if len(secret) < minSecret {
			return nil, fmt.Errorf("%s: an HS256 secret needs at least %d bytes, it has %d", c.TokenKeyFile, minSecret, len(secret))
		}
		methods = []string{"HS256"}
		v.key = secret
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(methods)}
	if !c.TokenOptionalExp {
		opts = append(opts, jwt.WithExpirationRequired())
	}
	if c.TokenIssuer != "" {
		opts = append(opts, jwt.WithIssuer(c.TokenIssuer))
	}
	if c.TokenAudience != "" {
		opts = append(opts, jwt.WithAudience(c.TokenAudience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// verify parses and checks a token.
func (v *verifier) verify(tok string) (*tokenClaims, error) {
	var claims tokenClaims
	if _, err := v.parser.ParseWithClaims(tok, &claims, func(*jwt.Token) (any, error) { return v.key, nil }); err != nil {
		return nil, err
	}
	return &claims, nil
}

// requestToken returns the token r presents, if any.
func requestToken(r *http.Request) (string, bool) {
	if tok, ok := bearer(r); ok {
		return tok, true
	}
	if tok := r.URL.Query().Get(tokenParam); tok != "" {
		return tok, true
	}
	if c, err := r.Cookie(tokenCookie); err == nil && c.Value != "" {
		return c.Value, true
	}
	return "", false
}

// access is what a request's token grants, put on its context by
// subscribers.wrap and read by subscribers.authorize.
type access struct {
	present bool         // the request presented a token
	claims  *tokenClaims // nil: no valid token
	err     error        // why the token is not valid, when present
	refused *refusal     // set by authorize for the answer's body
}

type accessKey struct{}

// subscribers decides who may read which topics.
type subscribers struct {
	verifier *verifier // nil: no tokens, only public topics
	public   Patterns
	expiries expiries        // contexts ending at token expiries
	stopping context.Context // done at shutdown: ends every stream and waiting poll
	log      *slog.Logger    // refusals, at info
}

// wrap verifies the request's token, if any, and makes its stream or
// waiting poll end when the token expires or the server shuts down.
func (s *subscribers) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := replayd.WithRevocation(r.Context(), s.stopping)
		a := access{refused: &refusal{}}
		if tok, ok := requestToken(r); ok {
			a.present = true
			if s.verifier == nil {
				a.err = errNoTokenKey
			} else {
				a.claims, a.err = s.verifier.verify(tok)
			}
		}
		w = &refusalWriter{ResponseWriter: w, ref: a.refused}
		if a.claims != nil && a.claims.ExpiresAt != nil {
			ctx = replayd.WithRevocation(ctx, s.expiries.at(a.claims.ExpiresAt.Time))
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, accessKey{}, a)))
	})
}

// authorize is the hub's Options.Authorize: every topic of the scope (the
// global scope is "") must be public or covered by the token's patterns.
func (s *subscribers) authorize(r *http.Request, topics []string) error {
	a, _ := r.Context().Value(accessKey{}).(access)
	scope := topics
	if len(scope) == 0 {
		scope = []string{""}
	}
	private := false
	for _, t := range scope {
		if !s.public.Match(t) {
			private = true
			break
		}
	}
	ref := a.refused
	if ref == nil {
		ref = &refusal{}
	}
	switch {
	case !private:
		return nil
	case !a.present:
		*ref = refusal{"token_missing", "no token: these topics need one (Authorization: Bearer, access_token or the replayd_token cookie)"}
	case a.claims == nil:
		*ref = tokenRefusal(a.err)
	default:
		for _, t := range scope {
			if !s.public.Match(t) && !a.claims.Topics.Match(t) {
				*ref = refusal{"topic_not_covered", fmt.Sprintf("the token does not cover the topic %q", t)}
				break
			}
		}
	}
	if ref.code == "" {
		return nil
	}
	s.log.Info("subscribe refused", "code", ref.code, "topics", topics, "remote", r.RemoteAddr)
	if ref.code == "topic_not_covered" {
		return errForbidden
	}
	return fmt.Errorf("%s: %w", ref.code, replayd.ErrUnauthenticated)
}

var (
	errForbidden  = errors.New("the token does not cover the topics")
	errNoTokenKey = errors.New("this server has no --token-key: only public topics can be read")
)

// A refusal names the check a subscriber's request failed: its code is
// stable (docs/server.md lists them), its message says it to a person.
type refusal struct{ code, msg string }

// tokenRefusal is the refusal of a token that did not verify.
func tokenRefusal(err error) refusal {
	for _, c := range []struct {
		err  error
		code string
	}{
		{errNoTokenKey, "token_key_missing"},
		{jwt.ErrTokenMalformed, "token_malformed"},
		{jwt.ErrTokenSignatureInvalid, "token_signature_invalid"},
		{jwt.ErrTokenUnverifiable, "token_signature_invalid"},
		{jwt.ErrTokenExpired, "token_expired"},
		{jwt.ErrTokenNotValidYet, "token_not_yet_valid"},
		{jwt.ErrTokenUsedBeforeIssued, "token_not_yet_valid"},
		{jwt.ErrTokenRequiredClaimMissing, "token_claim_missing"},
		{jwt.ErrTokenInvalidIssuer, "token_issuer_invalid"},
		{jwt.ErrTokenInvalidAudience, "token_audience_invalid"},
	} {
		if errors.Is(err, c.err) {
			return refusal{c.code, err.Error()}
		}
	}
	return refusal{"token_invalid", "the token is not valid"}
}

// refusalWriter answers a request authorize refused with a JSON body
// naming the refusal, {"error":message,"code":code}, instead of the hub's
// fixed text; anything else passes through (Unwrap: flushes and
// hijacking reach the connection).
type refusalWriter struct {
	http.ResponseWriter
	ref  *refusal
	done bool // the refusal is written: the hub's text is dropped
}

func (w *refusalWriter) WriteHeader(status int) {
	if w.done || w.ref.code == "" || status != http.StatusUnauthorized && status != http.StatusForbidden {
		w.ResponseWriter.WriteHeader(status)
		return
	}
	w.done = true
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="replayd"`)
	}
	writeJSON(w.ResponseWriter, status, errorAnswer{Error: w.ref.msg, Code: w.ref.code})
}

func (w *refusalWriter) Write(b []byte) (int, error) {
	if w.done {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *refusalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// expiries hands out contexts that end at a token's expiry, one per second
// of expiry shared by every request whose token expires then: a stream may
// outlive its handler (DetachConnections), so no request could release a
// context of its own, and a timer per request would pile up for as long
// as tokens live. Each is forgotten once it has ended.
type expiries struct {
	mu sync.Mutex                // guards m
	m  map[int64]context.Context // by Unix second
}

// at returns a context that ends at t, truncated to the second.
func (e *expiries) at(t time.Time) context.Context {
	sec := t.Unix()
	e.mu.Lock()
	defer e.mu.Unlock()
	if ctx, ok := e.m[sec]; ok {
		return ctx
	}
	if e.m == nil {
		e.m = map[int64]context.Context{}
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(sec, 0))
	e.m[sec] = ctx
	context.AfterFunc(ctx, func() {
		cancel()
		e.mu.Lock()
		delete(e.m, sec)
		e.mu.Unlock()
	})
	return ctx
}
