package replayd

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Tests of one stream's shape and limits: the retry field's placement, the
// queue cap against the largest frame, and a ResponseWriter that cannot
// flush.

// The stream begins with one block holding retry and the hello, byte for
// byte: "retry: N\nid: c\nevent: hello\ndata: …\n\n".
func TestSSERetryInHelloBlock(t *testing.T) {
	db, _ := openTestDB(t)
	h := newTestHub(t, db, Options{SSE: SSEOptions{Retry: 2 * time.Second, HeartbeatInterval: -1}})
	srv := serve(t, h)
	mustPublish(t, h, "", 1)
	resp, err := http.Get(srv.URL + "?topic=room")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var block strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", block.String(), err)
		}
		block.WriteString(line)
		if line == "\n" {
			break
		}
	}
	// The hello's data is checked elsewhere; here its place in the block.
	got := block.String()
	if !strings.HasPrefix(got, "retry: 2000\nid: 1\nevent: hello\ndata: {") || strings.Count(got, "\n") != 5 {
		t.Fatalf("first block %q, want retry, id, event and one data line", got)
	}
}
