package main_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Issue 27 item 5 across nodes: two `replayd serve --postgres` processes
// on one table prefix, idempotent producers racing on one stream through
// both.
//
//   - Shared producers: each batch of one producer (the same Producer-Id,
//     epoch 0, seq b) is sent by several senders released at once, half of
//     them to each node, each sender then sending it once more (a retry
//     whose answer was lost). Of all these attempts exactly one is answered
//     200, and every other 204 with Producer-Seq b: the producer's state is
//     read and written in the append's transaction, under the stream's
//     lock, whichever node serves it. Before some rounds a sender skips a
//     seq: 409, Producer-Expected-Seq b, Producer-Received-Seq b+1, and
//     nothing stored.
//   - Solo producers, at the same time on the same stream, each sending
//     each batch to one node and then to the other: 200, then 204.
//
// In the end the stream holds every batch exactly once, whole, each
// producer's in seq order, and reads the same through either node.
func TestStreamsProducersTwoNodes(t *testing.T) {
	const (
		shared        = 2   // producers whose batches several senders send at once
		senders       = 4   // per shared producer, half to each node
		sharedBatches = 100 // per shared producer
		solo          = 4   // producers of one sender each
		soloBatches   = 60  // per solo producer
		perMsg        = 3   // messages per batch
		gapEvery      = 20  // a shared producer's round b tries seq b+1 first when b%gapEvery == gapEvery-1
	)
	dsn, prefix := pgPrefix(t)
	args := []string{"--postgres", dsn, "--postgres-table-prefix", prefix, "--streams-dev"}
	nodes := []*daemon{start(t, nil, args...), start(t, nil, args...)}
	const stream = "race/producers"
	setup := &http.Client{Timeout: waitFor}
	defer setup.CloseIdleConnections()
	createStream(t, setup, nodes[0].base, stream)

	// tally counts one producer's answers; each is written by its
	// producer's goroutine alone and read after they all ended.
	type tally struct {
		ok, dup, gap int
		okOn         [2]int // the 200s, by node
	}
	tallies := make([]tally, shared+solo)
	errs := make(chan error, shared+solo)
	want := map[string]int{}
	t0 := time.Now()
	var wg sync.WaitGroup
	for p := range shared {
		id := fmt.Sprint("shared", p)
		want[id] = sharedBatches
		tl := &tallies[p]
		wg.Go(func() {
			// A client (and so a connection) per sender, kept warm, so that
			// the senders of a round reach their node together.
			clients := make([]*http.Client, senders)
			for i := range clients {
				clients[i] = &http.Client{Timeout: waitFor, Transport: &http.Transport{}}
				defer clients[i].CloseIdleConnections()
			}
			for b := range sharedBatches {
				body := batchBody(id, b, perMsg)
				if b%gapEvery == gapEvery-1 {
					s, h := appendAnswer(clients[0], nodes[b%2].base, stream, id, b+1, body)
					if s != http.StatusConflict || h.Get("Producer-Expected-Seq") != strconv.Itoa(b) || h.Get("Producer-Received-Seq") != strconv.Itoa(b+1) {
						errs <- fmt.Errorf("producer %s: seq %d with %d accepted: status %d, expected seq %q, received %q; want 409, %d, %d",
							id, b+1, b-1, s, h.Get("Producer-Expected-Seq"), h.Get("Producer-Received-Seq"), b, b+1)
						return
					}
					tl.gap++
				}
				// One round: every sender sends batch b, released at once,
				// then sends it again.
				type answer struct {
					status int
					h      http.Header
				}
				var got [senders][2]answer
				release := make(chan struct{})
				var round sync.WaitGroup
				for i := range senders {
					round.Go(func() {
						<-release
						for try := range 2 {
							s, h := appendAnswer(clients[i], nodes[i%2].base, stream, id, b, body)
							got[i][try] = answer{s, h}
						}
					})
				}
				close(release)
				round.Wait()
				oks := 0
				for i := range senders {
					for try, a := range got[i] {
						switch {
						case a.status == http.StatusOK && try == 0:
							oks++
							tl.ok++
							tl.okOn[i%2]++
						case a.status == http.StatusNoContent && a.h.Get("Producer-Seq") == strconv.Itoa(b) && a.h.Get("Producer-Epoch") == "0":
							tl.dup++
						default:
							errs <- fmt.Errorf("producer %s batch %d, sender %d (node %d) attempt %d: status %d, Producer-Seq %q; want 204 with seq %d (or 200 for one first attempt)",
								id, b, i, i%2, try, a.status, a.h.Get("Producer-Seq"), b)
							return
						}
					}
				}
				if oks != 1 {
					errs <- fmt.Errorf("producer %s batch %d: %d of %d attempts answered 200, want exactly 1", id, b, oks, 2*senders)
					return
				}
			}
		})
	}
	for p := range solo {
		id := fmt.Sprint("solo", p)
		want[id] = soloBatches
		tl := &tallies[shared+p]
		wg.Go(func() {
			client := &http.Client{Timeout: waitFor, Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			for b := range soloBatches {
				body := batchBody(id, b, perMsg)
				n := (p + b) % 2
				for try, w := range []int{http.StatusOK, http.StatusNoContent} {
					s, h := appendAnswer(client, nodes[n].base, stream, id, b, body)
					if s != w || h.Get("Producer-Seq") != strconv.Itoa(b) {
						errs <- fmt.Errorf("producer %s batch %d on node %d, attempt %d: status %d, Producer-Seq %q; want %d, %d",
							id, b, n, try, s, h.Get("Producer-Seq"), w, b)
						return
					}
					if try == 0 {
						tl.ok++
						tl.okOn[n]++
					} else {
						tl.dup++
					}
					n = 1 - n
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(t0)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	var (
		total    tally
		sharedOn [2]int // the races' winners, by node
	)
	for i, tl := range tallies {
		wantOK, wantDup := sharedBatches, sharedBatches*(2*senders-1)
		if i >= shared {
			wantOK, wantDup = soloBatches, soloBatches
		}
		if tl.ok != wantOK || tl.dup != wantDup {
			t.Errorf("producer %d: %d answers 200 and %d 204, want %d and %d", i, tl.ok, tl.dup, wantOK, wantDup)
		}
		total.ok, total.dup, total.gap = total.ok+tl.ok, total.dup+tl.dup, total.gap+tl.gap
		for n := range 2 {
			total.okOn[n] += tl.okOn[n]
			if i < shared {
				sharedOn[n] += tl.okOn[n]
			}
		}
	}
	t.Logf("%d appends in %v: %d stored (200; %d by node A, %d by node B), %d duplicates (204), %d seq gaps (409); the %d races of %d senders won by node A %d times, by node B %d",
		total.ok+total.dup+total.gap, took.Round(time.Millisecond), total.ok, total.okOn[0], total.okOn[1], total.dup, total.gap,
		shared*sharedBatches, senders, sharedOn[0], sharedOn[1])

	msgs := readAll(t, setup, nodes[0].base, stream)
	checkBatches(t, msgs, want, perMsg)
	if other := readAll(t, setup, nodes[1].base, stream); !slices.Equal(msgs, other) {
		t.Errorf("node B reads %d messages, not node A's %d", len(other), len(msgs))
	}
}
