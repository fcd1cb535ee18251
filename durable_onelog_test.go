package replayd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/replayd/replayd/client"
	"github.com/replayd/replayd/internal/wiretest"
)

// SPEC §19, one log, one cursor: a stream's messages are events of the
// hub's log on its topic, read with the same ids by every reader of the
// hub, and events published to the topic by the Go API are in the stream.

// A JSON stream's messages, appended one POST each, are read with the
// offsets' sequences as ids by a plain SSE client of Handler() resuming
// with Last-Event-ID, by PollHandler() and by the Go client on both
// transports; the Handler() reader also sees the stream's creation and
// close as typed events.
func TestDurableOneLogReaders(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	const name = "chat/42"
	base := seqOf(t, e.dsCreate(t, name, "application/json"))
	msgs := []string{`{"n":1}`, `{"n":2}`, `"three"`}
	var ids []int64
	for _, m := range msgs {
		ids = append(ids, seqOf(t, e.dsAppend(t, name, "application/json", m)))
	}
	a := e.dsRead(t, name, "-1")
	if got, want := string(a.body), "["+msgs[0]+","+msgs[1]+","+msgs[2]+"]"; got != want {
		t.Fatalf("stream read %s, want %s", got, want)
	}

	// Handler(), from the start of the log: the ds.create marker at the
	// stream's base, then the messages with the offsets' ids.
	c := e.dsSSE(t, name, 0)
	if f := c.NextNonHeartbeat(); f.Event != "ds.create" || f.ID != fmt.Sprint(base) {
		t.Fatalf("first frame %+v, want ds.create with id %d", f, base)
	}
	for i, id := range ids {
		f := c.NextIs(id, "Handler() message")
		if f.Event != "" && f.Event != "message" || f.Data != msgs[i] {
			t.Fatalf("Handler() frame %+v, want message %s", f, msgs[i])
		}
	}
	// Resuming with the first message's id as Last-Event-ID: the rest.
	c2 := e.dsSSE(t, name, ids[0])
	if got := wiretest.FrameIDs(c2.Events(2)); fmt.Sprint(got) != fmt.Sprint(ids[1:]) {
		t.Fatalf("resumed Handler() ids %v, want %v", got, ids[1:])
	}

	// PollHandler(), from the stream's base.
	p := wiretest.Poll(t, e.url, fmt.Sprintf("topic=%s&cursor=%d", name, base))
	if !slices.Equal(p.IDs(), ids) {
		t.Fatalf("poll ids %v, want %v", p.IDs(), ids)
	}
	for i, ev := range p.Events {
		if string(ev.Data) != msgs[i] || ev.Type != "message" {
			t.Fatalf("poll event %d: %s %s, want message %s", i, ev.Type, ev.Data, msgs[i])
		}
	}

	// The Go client, on both transports, from the stream's base.
	for _, tr := range []client.Transport{client.SSE, client.Poll} {
		got := runClient(t, client.Options{SSE: e.url + "/events", Poll: e.url + "/poll", Transport: tr, Topics: []string{name}, Cursor: base}, len(msgs))
		for i, ev := range got {
			if ev.ID != ids[i] || string(ev.Data) != msgs[i] {
				t.Fatalf("Go client (%s) event %d: %d %s, want %d %s", tr, i, ev.ID, ev.Data, ids[i], msgs[i])
			}
		}
	}

	// Close: a ds.close event on Handler(), and nothing on the stream's
	// side but Stream-Closed.
	a = dsDo(t, http.MethodPost, e.stream(name), http.Header{"Stream-Closed": {"true"}}, nil)
	if a.status/100 != 2 {
		t.Fatalf("close: %v", a)
	}
	if f := c.NextNonHeartbeat(); f.Event != "ds.close" {
		t.Fatalf("after close: %+v, want ds.close", f)
	}
	a = e.dsRead(t, name, offsetOf(ids[2]))
	if string(a.body) != "[]" || a.header.Get("Stream-Closed") != "true" {
		t.Fatalf("read at the tail of a closed stream: %q closed %q", a.body, a.header.Get("Stream-Closed"))
	}
	// Delete: a ds.delete event.
	if a := dsDo(t, http.MethodDelete, e.stream(name), nil, nil); a.status/100 != 2 {
		t.Fatalf("delete: %v", a)
	}
	if f := c.NextNonHeartbeat(); f.Event != "ds.delete" {
		t.Fatalf("after delete: %+v, want ds.delete", f)
	}
}

// runClient runs a Go client with opts until it has n events, and returns
// them; a gap fails the test.
func runClient(t *testing.T, opts client.Options, n int) []client.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	var got []client.Event
	errDone := errors.New("done")
	err := client.New(opts).Run(ctx, func(m client.Message) error {
		if m.Gap != nil {
			return fmt.Errorf("gap %+v", *m.Gap)
		}
		got = append(got, *m.Event)
		if len(got) == n {
			return errDone
		}
		return nil
	})
	if !errors.Is(err, errDone) {
		t.Fatalf("Go client (%s): %v after %d events", opts.Transport, err, len(got))
	}
	return got
}

// An event published with Publish to the stream's topic after its
// creation is in the stream's reads (catch-up, long-poll and SSE), with
// its sequence as offset.
func TestDurableOneLogPublishAppears(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	const name = "feed"
	base := e.dsCreate(t, name, "application/json")
	first := seqOf(t, e.dsAppend(t, name, "application/json", `{"via":"post"}`))
	ev := mustPublish(t, e.h, name, map[string]string{"via": "publish"})
	if ev.Sequence <= first {
		t.Fatalf("published %d after the append's %d", ev.Sequence, first)
	}
	a := e.dsRead(t, name, base)
	if got, want := string(a.body), `[{"via":"post"},{"via":"publish"}]`; got != want {
		t.Fatalf("read %s, want %s", got, want)
	}
	if got := a.header.Get("Stream-Next-Offset"); got != offsetOf(ev.Sequence) {
		t.Fatalf("Stream-Next-Offset %s, want the published event's %s", got, offsetOf(ev.Sequence))
	}
	a = e.dsRead(t, name, offsetOf(first)+"&live=long-poll")
	if string(a.body) != `[{"via":"publish"}]` {
		t.Fatalf("long-poll read %s", a.body)
	}
	// A long poll at the tail is woken by a Publish.
	done := make(chan dsAnswer, 1)
	go func() {
		done <- dsDo(t, http.MethodGet, e.stream(name)+"?live=long-poll&offset="+offsetOf(ev.Sequence), nil, nil)
	}()
	// The poll is registered before it reads (read.go); a publish before
	// or after that is in its answer either way.
	ev2 := mustPublish(t, e.h, name, 7)
	a = <-done
	if a.status != http.StatusOK || string(a.body) != "[7]" || a.header.Get("Stream-Next-Offset") != offsetOf(ev2.Sequence) {
		t.Fatalf("long poll woken by a Publish: %v next %s, want [7] at %d", a, a.header.Get("Stream-Next-Offset"), ev2.Sequence)
	}
}

// A text stream's and a binary stream's data are JSON strings on
// Handler(): the text, and the bytes in base64.
func TestDurableOneLogByteStreams(t *testing.T) {
	e := newDSEnv(t, Options{}, nil)
	e.dsCreate(t, "txt", "text/plain")
	e.dsCreate(t, "bin", "application/octet-stream")
	tid := seqOf(t, e.dsAppend(t, "txt", "text/plain", "héllo\nworld"))
	raw := []byte{0, 1, 2, 0xff, '\n', 'x'}
	bid := seqOf(t, e.dsAppend(t, "bin", "application/octet-stream", string(raw)))

	f := e.dsSSE(t, "txt", tid-1).NextIs(tid, "text stream on Handler()")
	var s string
	if err := json.Unmarshal([]byte(f.Data), &s); err != nil || s != "héllo\nworld" {
		t.Fatalf("text stream's event data %q (%v), want the text as a JSON string", f.Data, err)
	}
	f = e.dsSSE(t, "bin", bid-1).NextIs(bid, "binary stream on Handler()")
	if err := json.Unmarshal([]byte(f.Data), &s); err != nil {
		t.Fatalf("binary stream's event data %q: %v", f.Data, err)
	}
	if b, err := base64.StdEncoding.DecodeString(s); err != nil || string(b) != string(raw) {
		t.Fatalf("binary stream's event data %q decodes to %q (%v), want %q", s, b, err, raw)
	}
	// And the stream's own reads give the bytes back.
	if a := e.dsRead(t, "bin", "-1"); string(a.body) != string(raw) {
		t.Fatalf("binary read %q, want %q", a.body, raw)
	}
	if a := e.dsRead(t, "txt", "-1"); string(a.body) != "héllo\nworld" {
		t.Fatalf("text read %q", a.body)
	}
}
