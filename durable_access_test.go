package replayd

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
)

// SPEC §19, access: writes and reads go through the hub's authorization;
// opening a server is explicit, never the default.

// With DurableStreamsOptions{} (not Open) and no AuthorizeWrite, every
// write is refused with 403; reads, with no Authorize either, are open.
func TestDurableAccessWritesClosedByDefault(t *testing.T) {
	e := newDSEnv(t, Options{}, &DurableStreamsOptions{})
	for _, m := range []string{http.MethodPut, http.MethodPost, http.MethodDelete} {
		a := dsDo(t, m, e.stream("s"), ctype("application/json"), []byte(`1`))
		wantStatus(t, m+" without AuthorizeWrite", a, http.StatusForbidden, "")
	}
	// Nothing was created: a read finds no stream, and no event was stored.
	wantStatus(t, "GET", dsDo(t, http.MethodGet, e.stream("s"), nil, nil), http.StatusNotFound, "")
	if evs, err := e.h.Replay(t.Context(), "s", 0, 10); err != nil || len(evs) != 0 {
		t.Fatalf("refused writes stored %d events (%v)", len(evs), err)
	}
	// A cross-origin request gets no Access-Control-Allow-Origin: * either.
	a := dsDo(t, http.MethodGet, e.stream("s"), http.Header{"Origin": {"https://evil.example"}}, nil)
	if got := a.header.Get("Access-Control-Allow-Origin"); got == "*" {
		t.Fatalf("a closed server answers Access-Control-Allow-Origin %q", got)
	}
}

// AuthorizeWrite decides writes: an error wrapping ErrUnauthenticated is
// 401, any other 403, nil allows. Reads fall back to Options.Authorize,
// called with the stream's one topic.
func TestDurableAccessAuthorize(t *testing.T) {
	var (
		mu     sync.Mutex
		topics [][]string
	)
	opts := Options{Authorize: func(r *http.Request, ts []string) error {
		mu.Lock()
		topics = append(topics, slices.Clone(ts))
		mu.Unlock()
		switch r.Header.Get("X-Token") {
		case "reader":
			return nil
		case "":
			return fmt.Errorf("no token: %w", ErrUnauthenticated)
		}
		return errors.New("not this topic")
	}}
	write := func(r *http.Request, topic string) error {
		switch r.Header.Get("Authorization") {
		case "Bearer good":
			if topic != "room/1" {
				return errors.New("the key does not cover " + topic)
			}
			return nil
		case "":
			return fmt.Errorf("no key: %w", ErrUnauthenticated)
		}
		return errors.New("a key of another scope")
	}
	e := newDSEnv(t, opts, &DurableStreamsOptions{AuthorizeWrite: write})
	u := e.stream("room/1")
	hdr := func(kv ...string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	wantStatus(t, "PUT without a key", dsDo(t, http.MethodPut, u, hdr(), nil), http.StatusUnauthorized, "")
	wantStatus(t, "PUT with a bad key", dsDo(t, http.MethodPut, u, hdr("Authorization", "Bearer other"), nil), http.StatusForbidden, "")
	wantStatus(t, "PUT of another stream", dsDo(t, http.MethodPut, e.stream("room/2"), hdr("Authorization", "Bearer good"), nil), http.StatusForbidden, "")
	if a := dsDo(t, http.MethodPut, u, hdr("Authorization", "Bearer good"), nil); a.status != http.StatusCreated {
		t.Fatalf("PUT with the key: %v", a)
	}
	if a := dsDo(t, http.MethodPost, u, hdr("Authorization", "Bearer good"), []byte(`{"secret":1}`)); a.status/100 != 2 {
		t.Fatalf("POST with the key: %v", a)
	}
	wantStatus(t, "POST without a key", dsDo(t, http.MethodPost, u, hdr(), []byte(`2`)), http.StatusUnauthorized, "")
	wantStatus(t, "DELETE with a bad key", dsDo(t, http.MethodDelete, u, hdr("Authorization", "Bearer other"), nil), http.StatusForbidden, "")

	mu.Lock()
	topics = nil
	mu.Unlock()
	for _, mode := range dsModes {
		q := "?offset=-1" + mode
		wantStatus(t, "GET without a token"+mode, dsDo(t, http.MethodGet, u+q, nil, nil), http.StatusUnauthorized, "secret")
		wantStatus(t, "GET with a bad token"+mode, dsDo(t, http.MethodGet, u+q, http.Header{"X-Token": {"x"}}, nil), http.StatusForbidden, "secret")
	}
	if a := dsDo(t, http.MethodHead, u, nil, nil); a.status != http.StatusUnauthorized {
		t.Fatalf("HEAD without a token: %v", a)
	}
	if a := dsDo(t, http.MethodGet, u+"?offset=-1", http.Header{"X-Token": {"reader"}}, nil); a.status != http.StatusOK || string(a.body) != `[{"secret":1}]` {
		t.Fatalf("GET with a token: %v", a)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ts := range topics {
		if !slices.Equal(ts, []string{"room/1"}) {
			t.Fatalf("Authorize called with %q, want the stream's one topic", ts)
		}
	}
	if len(topics) != 2*len(dsModes)+2 {
		t.Fatalf("Authorize called %d times, want %d", len(topics), 2*len(dsModes)+2)
	}
}
