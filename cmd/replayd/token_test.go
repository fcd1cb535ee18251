package main_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/replayd/replayd/internal/wiretest"
)

// Who may read what: every wrong token, pattern and topic is refused, on
// both transports, and a token is found in the header, the access_token
// parameter or the replayd_token cookie.
func TestSubscriberTokens(t *testing.T) {
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "t.db")), "--token-issuer", "app", "--token-audience", "replayd")...)
	mint := func(claims jwt.MapClaims, key string) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exp := farFuture().Unix()
	good := func(topics ...string) string {
		return mint(jwt.MapClaims{"topics": topics, "exp": exp, "iss": "app", "aud": "replayd"}, testSecret)
	}
	rooms := good("room-*", "lobby")
	for _, tc := range []struct {
		name, query string
		header      http.Header
		status      int
	}{
		{"no token", "topic=room-1", nil, 401},
		{"public topic without a token", "topic=pub-news", nil, 200},
		{"public and private without a token", "topic=pub-news&topic=room-1", nil, 401},
		{"global scope without a token", "", nil, 401},
		{"prefix pattern", "topic=room-1", bearerHeader(rooms), 200},
		{"exact pattern", "topic=lobby", bearerHeader(rooms), 200},
		{"two topics, both covered", "topic=room-1&topic=lobby", bearerHeader(rooms), 200},
		{"public plus covered", "topic=room-1&topic=pub-x", bearerHeader(rooms), 200},
		{"topic outside the patterns", "topic=lobby-2", bearerHeader(rooms), 403},
		{"one of two topics outside", "topic=room-1&topic=other", bearerHeader(rooms), 403},
		{"global scope needs *", "", bearerHeader(rooms), 403},
		{"global scope with *", "", bearerHeader(good("*")), 200},
		{"query parameter", "topic=room-1&access_token=" + rooms, nil, 200},
		{"cookie", "topic=room-1", http.Header{"Cookie": {"replayd_token=" + rooms}}, 200},
		{"wrong signature", "topic=room-1", bearerHeader(mint(jwt.MapClaims{"topics": []string{"*"}, "exp": exp, "iss": "app", "aud": "replayd"}, testSecret+"x")), 401},
		{"expired", "topic=room-1", bearerHeader(mint(jwt.MapClaims{"topics": []string{"*"}, "exp": time.Now().Add(-time.Minute).Unix(), "iss": "app", "aud": "replayd"}, testSecret)), 401},
		{"no exp", "topic=room-1", bearerHeader(mint(jwt.MapClaims{"topics": []string{"*"}, "iss": "app", "aud": "replayd"}, testSecret)), 401},
		{"not yet valid", "topic=room-1", bearerHeader(mint(jwt.MapClaims{"topics": []string{"*"}, "exp": exp, "nbf": time.Now().Add(time.Hour).Unix(), "iss": "app", "aud": "replayd"}, testSecret)), 401},
		{"wrong issuer", "topic=room-1", bearerHeader(mint(jwt.MapClaims{"topics": []string{"*"}, "exp": exp, "iss": "evil", "aud": "replayd"}, testSecret)), 401},
		{"wrong audience", "topic=room-1", bearerHeader(mint(jwt.MapClaims{"topics": []string{"*"}, "exp": exp, "iss": "app", "aud": "other"}, testSecret)), 401},
		{"alg none", "topic=room-1", bearerHeader(noneToken(t, exp)), 401},
		{"garbage", "topic=room-1", bearerHeader("not.a.token"), 401},
		{"publish key as a token", "topic=room-1", bearerHeader(publishKey), 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// SSE: a refused stream never starts.
			c, status := wiretest.DialStatus(t, d.base+"/events?"+tc.query, tc.header)
			if status != tc.status {
				t.Errorf("SSE: %d, want %d", status, tc.status)
			}
			if c != nil {
				c.Hello()
				c.Close()
			}
			// Poll.
			resp, body := wiretest.Do(t, http.DefaultClient, http.MethodGet, d.base+"/poll?"+tc.query, tc.header, waitFor)
			if resp.StatusCode != tc.status {
				t.Errorf("poll: %d, want %d", resp.StatusCode, tc.status)
			}
			// A refusal names the check that failed, on both transports.
			if tc.status == 200 {
				return
			}
			resp, sseBody := wiretest.Do(t, http.DefaultClient, http.MethodGet, d.base+"/events?"+tc.query, tc.header, waitFor)
			for _, b := range [][]byte{body, sseBody} {
				var e struct{ Error, Code string }
				if err := json.Unmarshal(b, &e); err != nil || e.Code != refusalCodes[tc.name] || e.Error == "" {
					t.Errorf("body %q: want code %q and a message", b, refusalCodes[tc.name])
				}
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("SSE refusal Content-Type %q", ct)
			}
		})
	}
	// Refusals are logged at info with their code, without the token.
	logs := d.logs.String()
	if !strings.Contains(logs, `"level":"INFO","msg":"subscribe refused","code":"token_expired"`) {
		t.Errorf("no info line for the expired token's refusal in\n%s", logs)
	}
	if strings.Contains(logs, rooms) || strings.Contains(logs, "access_token") {
		t.Errorf("a token in the logs:\n%s", logs)
	}
}

// refusalCodes is the code each refused case of TestSubscriberTokens gets.
var refusalCodes = map[string]string{
	"no token":                           "token_missing",
	"public and private without a token": "token_missing",
	"global scope without a token":       "token_missing",
	"topic outside the patterns":         "topic_not_covered",
	"one of two topics outside":          "topic_not_covered",
	"global scope needs *":               "topic_not_covered",
	"wrong signature":                    "token_signature_invalid",
	"expired":                            "token_expired",
	"no exp":                             "token_claim_missing",
	"not yet valid":                      "token_not_yet_valid",
	"wrong issuer":                       "token_issuer_invalid",
	"wrong audience":                     "token_audience_invalid",
	"alg none":                           "token_signature_invalid",
	"garbage":                            "token_malformed",
	"publish key as a token":             "token_malformed",
}

// noneToken is an unsigned token (alg none) claiming everything.
func noneToken(t *testing.T, exp int64) string {
	s, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"topics": []string{"*"}, "exp": exp, "iss": "app", "aud": "replayd"}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A PEM public key verifies ES256 and EdDSA tokens; an HS256 token signed
// with the key's text is refused (no algorithm confusion).
func TestTokenPublicKeys(t *testing.T) {
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	edPub, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		pub    any
		method jwt.SigningMethod
		key    any
	}{
		{"ES256", &ecKey.PublicKey, jwt.SigningMethodES256, ecKey},
		{"EdDSA", edPub, jwt.SigningMethodEdDSA, edKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			der, err := x509.MarshalPKIXPublicKey(tc.pub)
			if err != nil {
				t.Fatal(err)
			}
			pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
			keyFile := filepath.Join(t.TempDir(), "pub.pem")
			if err := os.WriteFile(keyFile, pemBytes, 0o600); err != nil {
				t.Fatal(err)
			}
			d := start(t, nil, "--db", filepath.Join(t.TempDir(), "k.db"), "--token-key", keyFile)
			tok, err := jwt.NewWithClaims(tc.method, jwt.MapClaims{"topics": []string{"a"}, "exp": farFuture().Unix()}).SignedString(tc.key)
			if err != nil {
				t.Fatal(err)
			}
			confused, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"topics": []string{"a"}, "exp": farFuture().Unix()}).SignedString(pemBytes)
			if err != nil {
				t.Fatal(err)
			}
			for tok, want := range map[string]int{tok: 200, confused: 401} {
				resp, _ := wiretest.Do(t, http.DefaultClient, http.MethodGet, d.base+"/poll?topic=a", bearerHeader(tok), waitFor)
				if resp.StatusCode != want {
					t.Errorf("%d, want %d", resp.StatusCode, want)
				}
			}
		})
	}
}

// A stream ends when its token expires, as does a waiting poll; the client
// comes back with a fresh token and its cursor and gets everything
// published meanwhile, nothing twice.
func TestTokenExpiresMidStream(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { testTokenExpiresMidStream(t, mode.args) })
	}
}

func testTokenExpiresMidStream(t *testing.T, extra []string) {
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "x.db")), extra...)...)
	first := publish(t, d.base, "room-1", "e0", 0)
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	short := token(t, exp, "room-*")
	c := wiretest.Dial(t, d.base+"/events?topic=room-1&access_token="+short, wiretest.LastID(first.Sequence-1))
	c.Hello()
	c.NextIs(first.Sequence, "the replayed event")
	second := publish(t, d.base, "room-1", "e1", 1)
	c.NextIs(second.Sequence, "a live event")
	// A long poll with the same token waits, and is answered (empty) at
	// the expiry, long before its wait runs out.
	answer := wiretest.PollLater(t, d.base, "topic=room-1&wait=25&cursor="+strconv.FormatInt(second.Sequence, 10)+"&access_token="+short)
	c.Ended("the stream of an expiring token")
	if left := time.Until(exp); left > 0 {
		t.Errorf("the stream ended %v before its token expired", left)
	}
	if p := answer(); len(p.Events) != 0 {
		t.Errorf("the expiring poll got %v", p.IDs())
	}
	if time.Since(exp) > 5*time.Second {
		t.Errorf("the stream ended %v after its token expired", time.Since(exp))
	}
	// Published while the client had no stream.
	var want []int64
	for i := 2; i < 5; i++ {
		want = append(want, publish(t, d.base, "room-1", fmt.Sprintf("e%d", i), i).Sequence)
	}
	// The expired token no longer serves.
	if _, status := wiretest.DialStatus(t, d.base+"/events?topic=room-1&access_token="+short, nil); status != 401 {
		t.Errorf("the expired token: %d, want 401", status)
	}
	c = wiretest.Dial(t, d.base+"/events?topic=room-1&access_token="+token(t, farFuture(), "room-*"), wiretest.LastID(second.Sequence))
	c.Hello()
	for _, seq := range want {
		c.NextIs(seq, "an event published while the token was renewed")
	}
	c.Quiet(300 * time.Millisecond)
}

// A browser that holds its token in the replayd_token cookie: the page's
// backend (another port of the same host, so the same cookie) replaces the
// cookie with a fresh token while the stream is open; the stream still ends
// when the token it was opened with expires, and the reconnect, as an
// EventSource makes it (same URL, Last-Event-ID, the cookie jar's current
// cookie), resumes with everything published meanwhile, nothing twice.
func TestTokenCookieRefreshed(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { testTokenCookieRefreshed(t, mode.args) })
	}
}

func testTokenCookieRefreshed(t *testing.T, extra []string) {
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "c.db")), extra...)...)
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	short, fresh := token(t, exp, "room-*"), token(t, farFuture(), "room-*")
	var current atomic.Value // the token the backend hands out
	current.Store(short)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "replayd_token", Value: current.Load().(string), Path: "/",
			HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}))
	defer backend.Close()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar}
	visit := func(path string) {
		t.Helper()
		resp, err := browser.Get(backend.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	cookie := func() string {
		u, _ := url.Parse(d.base)
		for _, c := range jar.Cookies(u) {
			if c.Name == "replayd_token" {
				return c.Value
			}
		}
		return ""
	}
	visit("/login")
	if cookie() != short {
		t.Fatal("the backend's cookie is not sent to the server's port")
	}

	first := publish(t, d.base, "room-1", "c0", 0)
	events := d.base + "/events?topic=room-1" // the URL carries no token
	c, status := wiretest.DialClientStatus(t, browser, events, wiretest.LastID(first.Sequence-1))
	if status != http.StatusOK {
		t.Fatalf("the stream with the cookie: %d", status)
	}
	c.Hello()
	c.NextIs(first.Sequence, "the replayed event")
	second := publish(t, d.base, "room-1", "c1", 1)
	c.NextIs(second.Sequence, "a live event")
	// The page refreshes its cookie before the token expires.
	current.Store(fresh)
	visit("/refresh")
	if cookie() != fresh {
		t.Fatal("the cookie was not replaced")
	}
	c.Ended("the stream of an expiring token, its cookie since replaced")
	if left := time.Until(exp); left > 0 {
		t.Errorf("the stream ended %v before its token expired", left)
	}
	if late := time.Since(exp); late > 5*time.Second {
		t.Errorf("the stream ended %v after its token expired", late)
	}
	var want []int64
	for i := 2; i < 5; i++ {
		want = append(want, publish(t, d.base, "room-1", fmt.Sprintf("c%d", i), i).Sequence)
	}
	// The old cookie no longer serves: a page that did not refresh its
	// cookie in time is refused, not served a stream that ends at once.
	if _, status := wiretest.DialStatus(t, events, http.Header{"Cookie": {"replayd_token=" + short}, "Last-Event-ID": {fmt.Sprint(second.Sequence)}}); status != http.StatusUnauthorized {
		t.Errorf("the expired cookie: %d, want 401", status)
	}
	c, status = wiretest.DialClientStatus(t, browser, events, wiretest.LastID(second.Sequence))
	if status != http.StatusOK {
		t.Fatalf("the reconnect with the fresh cookie: %d", status)
	}
	c.Hello()
	for _, seq := range want {
		c.NextIs(seq, "an event published while the stream was down")
	}
	c.Quiet(300 * time.Millisecond)
}
