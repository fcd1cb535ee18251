package hubtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
)

// Restore describes how a backend's log is backed up and restored, for
// CheckRestore.
type Restore struct {
	// Open opens a hub on a new log: the original.
	Open func() *replayd.EventHub
	// Backup backs up the original log, whose hub is h, and returns the
	// hub the original goes on with: h, or a new hub if taking the backup
	// stopped the log.
	Backup func(h *replayd.EventHub) *replayd.EventHub
	// Restore loses the original log for good (h is its hub: close it),
	// restores the backup and returns a hub on the restored log. Or it
	// restores the backup in place, under h left running (the log's rows
	// replaced from outside, through the database's own connections), and
	// returns h: the restored log then takes its new events through the
	// hub that served the lost history.
	Restore func(h *replayd.EventHub) *replayd.EventHub
}

// CheckRestore checks log identity across a restore from a backup, as an
// operator makes one after a disk loss: the backup is taken at the 5th
// event, the original goes on to the 10th, which clients read over SSE and
// polls, then the backup is restored and takes 8 new events. A client
// resuming at the 10th (reused by the restored log's new events, unless
// the log tells them apart) gets an unknown_cursor gap, which names every
// event at or below the head, and then the next event live; a client at
// the 5th (the backup point) or at the 3rd gets every event of the restored
// history above its cursor, without a gap: the two histories agree there.
// A Go client (package client) resuming at the 10th gets the same gap, over
// SSE and over polls. For a restore in place, an SSE stream and a gap
// subscriber left open on the hub across the restore are told too: the
// stream ends, without any of the restored log's events, and the
// subscriber gets an unknown_cursor gap before them.
func CheckRestore(t *testing.T, r Restore) {
	h := r.Open()
	url := wiretest.ServePoll(t, h)
	var old []replayd.Event
	for i := range 5 {
		old = append(old, mustPublish(t, h, "", fmt.Sprintf("old %d", i+1)))
	}
	if h2 := r.Backup(h); h2 != h {
		h, url = h2, wiretest.ServePoll(t, h2)
	}
	for i := 5; i < 10; i++ {
		old = append(old, mustPublish(t, h, "", fmt.Sprintf("old %d", i+1)))
	}
	oldIDs := seqs(old)
	// Clients read the original to its 10th event.
	c := wiretest.Dial(t, url+"/events", wiretest.LastID(0))
	c.Hello()
	if got := frameSeqs(t, c.Events(10)); !slices.Equal(got, oldIDs) {
		t.Fatalf("the original log's events: %v, want %v", got, oldIDs)
	}
	c.Close()
	if p := wiretest.Poll(t, url, "cursor=0"); !slices.Equal(p.IDs(), oldIDs) || p.Gap != nil {
		t.Fatalf("poll of the original log: %+v", p)
	}
	c10, c5, c3 := oldIDs[9], oldIDs[4], oldIDs[2]
	// Left open across the restore: a stream caught up with the original,
	// and a gap subscriber.
	across := wiretest.Dial(t, url+"/events", wiretest.LastID(c10))
	across.Hello()
	told := wiretest.NewRecorder()
	unsubscribe := h.SubscribeWithGaps(func(ev replayd.Event) { told.Add(fmt.Sprint(ev.Sequence)) },
		func(g replayd.Gap) { told.Add("gap " + g.Reason) })
	defer unsubscribe()

	orig := h
	h = r.Restore(h)
	inPlace := h == orig
	url = wiretest.ServePoll(t, h)
	var restored []replayd.Event
	for i := range 8 {
		restored = append(restored, mustPublish(t, h, "", fmt.Sprintf("restored %d", i+1)))
	}
	newIDs := seqs(restored)
	for _, ev := range restored {
		if slices.Contains(oldIDs, ev.Sequence) {
			t.Fatalf("the restored log's event %d reuses a sequence of the lost history %v", ev.Sequence, oldIDs)
		}
	}
	across.Ended("a stream open on the original across the restore")
	if inPlace {
		// The subscriber is told of the replaced log before its events.
		want := []string{"gap " + replayd.GapUnknownCursor}
		for _, s := range newIDs {
			want = append(want, fmt.Sprint(s))
		}
		if got := told.Wait(t, len(want)); !slices.Equal(got, want) {
			t.Fatalf("a gap subscriber across the restore in place got %v, want %v", got, want)
		}
	}
	head, err := h.LatestSequence(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("original: %v; restored log's new events: %v, head %d", oldIDs, newIDs, head)

	// At the 10th: unknown_cursor, then from the head.
	s10 := wiretest.Dial(t, url+"/events", wiretest.LastID(c10))
	if _, _, cursor, hh := s10.Hello(); cursor != head || hh != head {
		t.Fatalf("resuming at %d: hello cursor %d head %d, want both %d", c10, cursor, hh, head)
	}
	if g := wiretest.MustGap(t, s10.Next()); g.Reason != "unknown_cursor" || g.ResumedFrom == nil || *g.ResumedFrom != c10 {
		t.Fatalf("resuming at %d over SSE: gap %s, want unknown_cursor", c10, g.String())
	}
	p10 := wiretest.Poll(t, url, fmt.Sprintf("cursor=%d", c10))
	if p10.Gap == nil || p10.Gap.Reason != "unknown_cursor" || len(p10.Events) != 0 || p10.Cursor != head {
		t.Fatalf("polling at %d: %+v, want an unknown_cursor gap and the cursor %d", c10, p10, head)
	}
	// The Go client, over each transport, at the 10th: the same gap.
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		if m := firstMessage(t, client.Options{SSE: url + "/events", Poll: url + "/poll", Transport: tr, Cursor: c10}); m.Gap == nil ||
			m.Gap.Reason != "unknown_cursor" || m.Gap.ResumedFrom == nil || *m.Gap.ResumedFrom != c10 {
			t.Fatalf("the Go client (%s) resuming at %d: %+v, want an unknown_cursor gap", tr, c10, m)
		}
	}
	// At or below the backup point: the restored history, no gap.
	streams := map[int64]*wiretest.Client{}
	for _, cur := range []int64{c5, c3} {
		want := append(slices.Clone(oldIDs[slices.Index(oldIDs, cur)+1:5]), newIDs...)
		s := wiretest.Dial(t, url+"/events", wiretest.LastID(cur))
		if _, _, cursor, _ := s.Hello(); cursor != cur {
			t.Fatalf("resuming at %d: hello cursor %d", cur, cursor)
		}
		if got := frameSeqs(t, s.Events(len(want))); !slices.Equal(got, want) {
			t.Fatalf("resuming at %d over SSE: %v, want %v", cur, got, want)
		}
		streams[cur] = s
		p := wiretest.Poll(t, url, fmt.Sprintf("cursor=%d", cur))
		if p.Gap != nil || !slices.Equal(p.IDs(), want) {
			t.Fatalf("polling at %d: %+v, want %v and no gap", cur, p, want)
		}
	}
	// Everyone goes on live.
	streams[c10] = s10
	live := mustPublish(t, h, "", "live")
	for cur, s := range streams {
		if f := s.NextNonHeartbeat(); f.ID != fmt.Sprint(live.Sequence) {
			t.Fatalf("the stream resumed at %d got %+v, want the live event %d", cur, f, live.Sequence)
		}
	}
	if p := wiretest.Poll(t, url, fmt.Sprintf("cursor=%d", p10.Cursor)); p.Gap != nil || !slices.Equal(p.IDs(), []int64{live.Sequence}) {
		t.Fatalf("polling on from %d: %+v, want the live event %d", p10.Cursor, p, live.Sequence)
	}
}

// firstMessage runs a Go client with opts until its first message, within
// wiretest.WaitFor, and returns it.
func firstMessage(t *testing.T, opts client.Options) client.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wiretest.WaitFor)
	defer cancel()
	opts.PollWait = time.Second
	errFirst := errors.New("first message")
	var first client.Message
	err := client.New(opts).Run(ctx, func(m client.Message) error {
		first = m
		return errFirst
	})
	if !errors.Is(err, errFirst) {
		t.Fatalf("the Go client from %d (%s): %v", opts.Cursor, opts.Transport, err)
	}
	return first
}

// frameSeqs returns the frames' ids as sequences, failing on a frame that
// is not an event.
func frameSeqs(t testing.TB, fs []frame) []int64 {
	t.Helper()
	out := make([]int64, len(fs))
	for i, f := range fs {
		if f.Event != "" && f.Event != "message" {
			t.Fatalf("frame %d is a %q: %+v", i, f.Event, f)
		}
		if _, err := fmt.Sscan(f.ID, &out[i]); err != nil {
			t.Fatalf("frame %d: id %q: %v", i, f.ID, err)
		}
	}
	return out
}
