package replayd

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/replayd/replayd/internal/countstore"
)

// longJob starts job id writing n tokens (of 1 to 4 UTF-8 bytes a
// character, so of 1 or 2 UTF-16 units), an event every 50, pausing a
// millisecond every 200 tokens (with a Linger of a millisecond: many
// messages of about a KiB); it stays streaming until release is closed. It returns the text and the events as written,
// once all of it is committed.
func longJob(t testing.TB, j *Jobs, id string, n int, release <-chan struct{}) (text string, events []string) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		switch i % 5 {
		case 1:
			b.WriteString(" é")
		case 3:
			b.WriteString(" 😀")
		default:
			fmt.Fprintf(&b, " t%d", i)
		}
		if i%50 == 0 {
			events = append(events, fmt.Sprintf(`{"i":%d,"timestamp":1}`, i))
		}
	}
	text = b.String()
	if _, _, err := j.Start(context.Background(), id, func(ctx context.Context, w *JobWriter) (any, error) {
		for i := range n {
			if i%50 == 0 {
				w.Emit(map[string]any{"i": i, "timestamp": 1})
			}
			var tok string
			switch i % 5 {
			case 1:
				tok = " é"
			case 3:
				tok = " 😀"
			default:
				tok = fmt.Sprintf(" t%d", i)
			}
			if _, err := w.WriteString(tok); err != nil {
				return nil, err
			}
			if i%200 == 199 {
				time.Sleep(time.Millisecond) // the upstream's pace
			}
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	want := int64(len(utf16.Encode([]rune(text))))
	deadline := time.Now().Add(30 * time.Second)
	for {
		in, err := j.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if in.TextLen == want && in.Events == int64(len(events)) {
			return text, events
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %d of %d units committed", id, in.TextLen, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A read from any text and event offset of a long answer (one with
// marks: it starts near its offsets, not at the stream's start) returns
// exactly the text and the events from those offsets.
func TestJobsReadFromAnyOffset(t *testing.T) {
	e := newJobsEnv(t, JobsOptions{Linger: time.Millisecond}, nil)
	release := make(chan struct{})
	defer close(release)
	text, events := longJob(t, e.j, "long", 20000, release)
	u := utf16.Encode([]rune(text))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		since := rng.Int64N(int64(len(u)) + 10)
		eventSince := rng.Int64N(int64(len(events)) + 2)
		if i%3 == 0 { // a poll that follows: its two offsets agree
			eventSince = min(since/int64(len(u)/len(events)+1), int64(len(events)))
		}
		p, err := e.j.Read(t.Context(), "long", since, eventSince)
		if err != nil {
			t.Fatal(err)
		}
		s := min(since, int64(len(u)))
		if s > 0 && s < int64(len(u)) && utf16.IsSurrogate(rune(u[s])) && u[s] >= 0xdc00 {
			s-- // inside a pair: from the pair
		}
		if want := string(utf16.Decode(u[s:])); p.Append != want {
			t.Fatalf("since %d: %d units, want %d", since, len(utf16.Encode([]rune(p.Append))), len(u)-int(s))
		}
		es := min(eventSince, int64(len(events)))
		if len(p.Events) != len(events)-int(es) {
			t.Fatalf("eventSince %d: %d events, want %d", eventSince, len(p.Events), len(events)-int(es))
		}
		for k, ev := range p.Events {
			var got, want any
			json.Unmarshal(ev, &got)
			json.Unmarshal([]byte(events[int(es)+k]), &want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("eventSince %d: event %d is %s, want %s", eventSince, k, ev, events[int(es)+k])
			}
		}
	}
}

// BenchmarkJobsPoll: a poll of a streaming 1 MB answer at its end (the
// last few hundred bytes) and at its start (the whole answer), and at the
// end of a 16 KB answer; store-bytes/op are the payload bytes the
// poll read from the store. A poll at the end costs about the same
// whatever the answer's length (ratio end-1MB / end-16KB), far less than
// reading it all (start-1MB / end-1MB).
//
//	go test -run '^$' -bench BenchmarkJobsPoll -benchtime 200x .
func BenchmarkJobsPoll(b *testing.B) {
	_, path := openTestDB(b)
	cs := countstore.OpenCounting(b, path)
	h, err := NewWithStore(cs, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	j, err := h.Jobs(JobsOptions{Linger: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	long, _ := longJob(b, j, "long", 1<<20/5, release)
	short, _ := longJob(b, j, "short", 16<<10/5, release)
	for _, c := range []struct {
		name  string
		id    string
		since int64
	}{
		{"end-1MB", "long", int64(len(utf16.Encode([]rune(long)))) - 200},
		{"start-1MB", "long", 0},
		{"end-16KB", "short", int64(len(utf16.Encode([]rune(short)))) - 200},
	} {
		b.Run(c.name, func(b *testing.B) {
			before := cs.ReadBytes.Load()
			for b.Loop() {
				if _, err := j.Read(context.Background(), c.id, c.since, 1<<40); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cs.ReadBytes.Load()-before)/float64(b.N), "store-bytes/op")
		})
	}
}
