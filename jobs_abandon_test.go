package replayd

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/replayd/replayd/internal/wiretest"
)

// hold sends a GET to u and reads its body until the test ends (or the
// server ends it): a reader held open. It reports the status once known.
func hold(t *testing.T, u string) <-chan int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	status := make(chan int, 1)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		defer resp.Body.Close()
		status <- resp.StatusCode
		io.Copy(io.Discard, resp.Body)
	}()
	return status
}

// Reads through Handler(), PollHandler() and the Durable Streams protocol
// count against abandonment, on the node running the job and on another
// node sharing its store: a job read only by an SSE stream held open, by
// a client polling, by a Durable Streams SSE reader or long poll, streams
// on for several AbandonAfter; the same job read by nobody is abandoned.
func TestJobsAbandonedUnlessReadOverTheHandlers(t *testing.T) {
	_, path := openTestDB(t)
	opts := JobsOptions{AbandonAfter: 500 * time.Millisecond, Lease: 200 * time.Millisecond}
	a := newJobsEnvAt(t, path, opts, nil) // runs the jobs
	b := newJobsEnvAt(t, path, opts, nil) // another node, which only reads
	cancelled := make(map[string]chan struct{})
	stop := make(chan struct{})
	ids := []string{"none", "sse", "poll", "poll-here", "ds-sse", "ds-longpoll"}
	for _, id := range ids {
		c := make(chan struct{})
		cancelled[id] = c
		if _, _, err := a.j.Start(t.Context(), id, func(ctx context.Context, w *JobWriter) (any, error) {
			select {
			case <-stop:
				return "ok", nil
			case <-ctx.Done():
				close(c)
				return nil, ctx.Err()
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()

	// (a) an SSE stream of Handler() on the job's topic (with another
	// topic in its scope), on node b, held open.
	sse := wiretest.Dial(t, b.url+"/events?topic=other&topic="+b.j.Topic("sse"), nil)
	sse.Hello()
	// (b) clients polling PollHandler(), on node b and on node a, every
	// 50 ms.
	pollCtx, stopPolls := context.WithCancel(context.Background())
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pollCtx.Err() == nil {
			for _, q := range []string{b.url + "/poll?topic=" + b.j.Topic("poll"), a.url + "/poll?topic=" + a.j.Topic("poll-here")} {
				req, _ := http.NewRequestWithContext(pollCtx, http.MethodGet, q+"&cursor=0", nil)
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			select {
			case <-pollCtx.Done():
			case <-time.After(50 * time.Millisecond): // the client's poll cadence
			}
		}
	}()
	defer func() { stopPolls(); <-polled }()
	// (c) Durable Streams readers: SSE on node b, a long poll on node a
	// (it waits, the job writing nothing, for the poll's MaxWait).
	dsSSE := hold(t, b.url+"/v1/stream/"+b.j.Topic("ds-sse")+"?offset=-1&live=sse")
	hold(t, a.url+"/v1/stream/"+a.j.Topic("ds-longpoll")+"?offset=now&live=long-poll")
	if s := <-dsSSE; s != http.StatusOK {
		t.Fatalf("durable streams sse: %d", s)
	}

	// The unread job is abandoned: error abandoned, its context cancelled.
	select {
	case <-cancelled["none"]:
	case <-time.After(wiretest.WaitFor):
		t.Fatal("the unread job's context was not cancelled")
	}
	if in := waitJob(t, a.j, "none", JobError); in.Err == nil || in.Err.Code != JobAbandoned {
		t.Fatalf("unread job: %+v", in)
	}
	// The others are still streaming four AbandonAfter after their start.
	for time.Since(start) < 4*opts.AbandonAfter {
		for _, id := range ids[1:] {
			in, err := a.j.Get(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if in.Status != JobStreaming {
				t.Fatalf("job %s, read over the handlers, after %v: %+v %+v", id, time.Since(start), in, in.Err)
			}
		}
		time.Sleep(20 * time.Millisecond) // sampling the status
	}
	close(stop)
	for _, id := range ids[1:] {
		waitJob(t, a.j, id, JobComplete)
	}
}
