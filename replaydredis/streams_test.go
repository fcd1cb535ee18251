package replaydredis

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/replaydredis/internal/redisserver"
)

// Durable Streams over two nodes on one Redis log: a JSON stream created
// on node A, appended to by four writers at once through both nodes (the
// stream transactions contend for the topic and retry), reads the same,
// every message once, through either node.
func TestDurableStreamsTwoNodes(t *testing.T) {
	srv := redisserver.Start(t)
	prefix := testPrefix(t)
	var urls []string
	for range 2 {
		h := hubOn(t, openStore(t, srv.URL(), prefix))
		mux := http.NewServeMux()
		mux.Handle("/v1/stream/", h.DurableStreams(replayd.DurableStreamsOptions{Open: true}))
		hs := httptest.NewServer(mux)
		t.Cleanup(hs.Close)
		urls = append(urls, hs.URL+"/v1/stream/chat")
	}
	client := &http.Client{Timeout: 30 * time.Second}
	do := func(method, u string, body []byte) (int, []byte, error) {
		req, err := http.NewRequestWithContext(t.Context(), method, u, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	if code, b, err := do(http.MethodPut, urls[0], nil); err != nil || code != http.StatusCreated {
		t.Fatalf("PUT: %d %s %v", code, b, err)
	}
	const writers, each = 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				msg := fmt.Appendf(nil, `{"w":%d,"i":%d}`, w, i)
				if code, b, err := do(http.MethodPost, urls[(w+i)%2], msg); err != nil || code/100 != 2 {
					errs <- fmt.Errorf("POST %s: %d %s %v", msg, code, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var reads [2][]map[string]int
	for n, u := range urls {
		code, b, err := do(http.MethodGet, u+"?offset=-1", nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET through node %d: %d %s %v", n, code, b, err)
		}
		if err := json.Unmarshal(b, &reads[n]); err != nil {
			t.Fatalf("GET through node %d: %s: %v", n, b, err)
		}
	}
	if len(reads[0]) != writers*each || fmt.Sprint(reads[0]) != fmt.Sprint(reads[1]) {
		t.Fatalf("the stream through node A: %d messages %v; through node B: %v; want %d, the same", len(reads[0]), reads[0], reads[1], writers*each)
	}
	// Each writer's messages, once each, in the order it sent them.
	for w := range writers {
		var got []int
		for _, m := range reads[0] {
			if m["w"] == w {
				got = append(got, m["i"])
			}
		}
		want := make([]int, each)
		for i := range want {
			want[i] = i
		}
		if !slices.Equal(got, want) {
			t.Fatalf("writer %d's messages: %v, want %v", w, got, want)
		}
	}
}
