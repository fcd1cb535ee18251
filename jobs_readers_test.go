package replayd

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/replayd/replayd/internal/jobtest"

	"github.com/replayd/replayd/internal/wiretest"
)

// jobMessage is one message of a job's stream (docs/jobs.md).
type jobMessage struct {
	K      string          `json:"k"`
	O      *int64          `json:"o"`
	T      string          `json:"t"`
	N      *int64          `json:"n"`
	E      json.RawMessage `json:"e"`
	P      json.RawMessage `json:"p"`
	Status string          `json:"status"`
}

// A token-per-write upstream is coalesced: far fewer commits than writes,
// and the text is whole.
func TestJobsCoalescesWrites(t *testing.T) {
	e := newJobsEnv(t, JobsOptions{}, nil)
	const n = 2000
	if _, _, err := e.j.Start(t.Context(), "burst", func(ctx context.Context, w *JobWriter) (any, error) {
		for range n {
			w.WriteString("x")
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitJob(t, e.j, "burst", JobComplete)
	evs, err := e.h.Replay(t.Context(), e.j.Topic("burst"), 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	chunks := 0
	for _, ev := range evs {
		var m jobMessage
		if json.Unmarshal(ev.Payload, &m) == nil && m.K == "text" {
			chunks++
			text.WriteString(m.T)
		}
	}
	if text.String() != strings.Repeat("x", n) || chunks > n/20 {
		t.Fatalf("%d writes became %d text messages (%d bytes)", n, chunks, text.Len())
	}
}

// A job is a Durable Stream: the protocol reads its messages, closed at
// the end; PollHandler() and Replay read the same events of its topic.
func TestJobsReadableOverTheLog(t *testing.T) {
	toks := jobtest.Tokens(30)
	e := newJobsEnv(t, JobsOptions{}, nil)
	if _, _, err := e.j.Start(t.Context(), "shared", llm(toks, 0)); err != nil {
		t.Fatal(err)
	}
	waitJob(t, e.j, "shared", JobComplete)

	a := dsDo(t, http.MethodGet, e.url+"/v1/stream/"+e.j.Topic("shared")+"?offset=-1", nil, nil)
	if a.status != 200 || a.header.Get("Stream-Closed") != "true" || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("durable streams read: %s %v", a, a.header)
	}
	var msgs []jobMessage
	if err := json.Unmarshal(a.body, &msgs); err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	type progressMsg struct {
		Phase     string `json:"phase"`
		UpdatedAt int64  `json:"updated_at"`
	}
	var progress []progressMsg
	for _, m := range msgs {
		switch m.K {
		case "text":
			text.WriteString(m.T)
		case "progress": // each snapshot committed is in the log too
			var pr progressMsg
			if err := json.Unmarshal(m.P, &pr); err != nil {
				t.Fatalf("progress message %s: %v", m.P, err)
			}
			progress = append(progress, pr)
		}
	}
	if len(progress) != 1 || progress[0].Phase != "generation" || progress[0].UpdatedAt == 0 {
		t.Fatalf("progress messages %+v, want the one snapshot", progress)
	}
	if text.String() != strings.Join(toks, "") || msgs[len(msgs)-1].K != "end" || msgs[len(msgs)-1].Status != "complete" {
		t.Fatalf("durable streams messages: %q, last %+v", text.String(), msgs[len(msgs)-1])
	}

	p := wiretest.Poll(t, e.url, "topic="+e.j.Topic("shared")+"&cursor=0&limit=1000")
	evs, err := e.h.Replay(t.Context(), e.j.Topic("shared"), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Events) != len(evs) || len(evs) != len(msgs)+2 { // + ds.create and ds.close markers
		t.Fatalf("poll %d events, replay %d, stream %d messages", len(p.Events), len(evs), len(msgs))
	}
	for i, ev := range evs {
		if p.Events[i].ID != ev.Sequence {
			t.Fatalf("event %d: poll id %d, replay %d", i, p.Events[i].ID, ev.Sequence)
		}
	}
}
