package main_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tailLine is one line `replayd tail` prints.
type tailLine struct {
	Sequence int64           `json:"sequence"`
	Type     string          `json:"type"`
	Data     json.RawMessage `json:"data"`
	Gap      *struct {
		Reason  string `json:"reason"`
		From    *int64 `json:"from"`
		Through *int64 `json:"through"`
		Count   *int64 `json:"count"`
	} `json:"gap"`
	raw string
}

// tailer is one running `replayd tail`.
type tailer struct {
	cmd    *exec.Cmd
	lines  chan tailLine // every line, in order; closed at EOF
	stderr *syncBuffer
	done   chan struct{} // closed when the process has exited
	err    error         // its Wait error, once done
}

// startTail runs `replayd tail args…`; it is killed at the end of the
// test if still running.
func startTail(t *testing.T, args ...string) *tailer {
	t.Helper()
	tl := &tailer{lines: make(chan tailLine, 4096), stderr: &syncBuffer{}, done: make(chan struct{})}
	tl.cmd = exec.Command(bin, append([]string{"tail"}, args...)...)
	tl.cmd.Stderr = tl.stderr
	out, err := tl.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l := tailLine{raw: sc.Text()}
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				l.raw = "unparsable: " + l.raw
			}
			tl.lines <- l
		}
		close(tl.lines)
		tl.err = tl.cmd.Wait()
		close(tl.done)
	}()
	t.Cleanup(func() {
		tl.cmd.Process.Kill()
		select {
		case <-tl.done:
		case <-time.After(waitFor):
			t.Errorf("replayd tail still running %v after SIGKILL", waitFor)
		}
		if t.Failed() {
			t.Logf("replayd tail stderr:\n%s", tl.stderr.String())
		}
	})
	return tl
}

// next returns the next line, failing the test if none comes in time.
func (tl *tailer) next(t *testing.T) tailLine {
	t.Helper()
	select {
	case l, ok := <-tl.lines:
		if !ok {
			<-tl.done
			t.Fatalf("replayd tail ended: %v; stderr: %s", tl.err, tl.stderr.String())
		}
		if strings.HasPrefix(l.raw, "unparsable: ") {
			t.Fatalf("line %s", l.raw)
		}
		return l
	case <-time.After(waitFor):
		t.Fatalf("no line from replayd tail within %v; stderr: %s", waitFor, tl.stderr.String())
	}
	return tailLine{}
}

// signal sends sig and waits for the exit, returning the lines printed
// but not read yet and the exit error.
func (tl *tailer) signal(t *testing.T, sig syscall.Signal) ([]tailLine, error) {
	t.Helper()
	if err := tl.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	var rest []tailLine
	timeout := time.After(waitFor)
	for {
		select {
		case l, ok := <-tl.lines:
			if !ok {
				<-tl.done
				return rest, tl.err
			}
			rest = append(rest, l)
		case <-timeout:
			t.Fatalf("replayd tail still running %v after %v", waitFor, sig)
		}
	}
}

// Events and a gap, over each transport: a gap line names the missed
// range, then the events follow in order, with their topic where the
// transport carries it (null for a broadcast over polls).
func TestTailPrintsEventsAndGap(t *testing.T) {
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "t.db")), "--replay-limit", "3")...)
	var seqs []int64
	for i := range 6 {
		seqs = append(seqs, publish(t, d.base, "room-1", fmt.Sprint("e", i), map[string]int{"n": i}).Sequence)
	}
	bcast := publish(t, d.base, "", "b", "to all").Sequence
	tok := token(t, farFuture(), "*")
	for _, transport := range []string{"sse", "poll"} {
		t.Run(transport, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "s.json")
			tl := startTail(t, d.base, "--transport", transport, "--token", tok, "--topic", "room-1", "--state", state)
			// Polls page through the log (no replay limit); SSE replays at
			// most 3 events and names the rest with a gap.
			first := 4
			if transport == "poll" {
				first = 0
			} else {
				g := tl.next(t)
				if g.Gap == nil || g.Gap.Reason != "replay_limit" || g.Gap.From == nil || g.Gap.Through == nil ||
					*g.Gap.From != seqs[0] || *g.Gap.Through != seqs[3] {
					t.Fatalf("first line %s: want a replay_limit gap from %d through %d", g.raw, seqs[0], seqs[3])
				}
				if strings.Contains(g.raw, `"sequence"`) || (g.Gap.Count != nil && *g.Gap.Count != 4) {
					t.Errorf("gap line %s", g.raw)
				}
			}
			type line struct {
				seq   int64
				data  string
				topic string // over polls
			}
			var want []line
			for i := first; i < len(seqs); i++ {
				want = append(want, line{seqs[i], fmt.Sprintf(`{"n":%d}`, i), `"room-1"`})
			}
			want = append(want, line{bcast, `"to all"`, `null`})
			for _, w := range want {
				l := tl.next(t)
				if l.Gap != nil || l.Sequence != w.seq || string(l.Data) != w.data || l.Type != "message" {
					t.Fatalf("line %s: want sequence %d data %s", l.raw, w.seq, w.data)
				}
				switch {
				case transport == "sse" && strings.Contains(l.raw, `"topic"`):
					t.Errorf("line %s: a topic over SSE, which does not carry it", l.raw)
				case transport == "poll" && !strings.Contains(l.raw, `"topic":`+w.topic+`,`):
					t.Errorf("line %s: want topic %s", l.raw, w.topic)
				}
			}
			if rest, err := tl.signal(t, syscall.SIGINT); err != nil || len(rest) != 0 {
				t.Errorf("after SIGINT: %v, lines %v", err, rest)
			}
			if got := readState(t, state); got != bcast {
				t.Errorf("state holds %d, want %d", got, bcast)
			}
		})
	}
}

// readState returns the cursor a --state file holds.
func readState(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s struct{ Cursor int64 }
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("state %q: %v", b, err)
	}
	return s.Cursor
}

// A tail stopped with SIGTERM saves its cursor and exits 0; the next one
// with the same --state goes on after it, ignoring --cursor.
func TestTailStateResume(t *testing.T) {
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "s.db"))...)
	state := filepath.Join(t.TempDir(), "s.json")
	var seqs []int64
	for i := range 3 {
		seqs = append(seqs, publish(t, d.base, "pub-1", fmt.Sprint("a", i), i).Sequence)
	}
	tl := startTail(t, d.base, "--topic", "pub-1", "--state", state, "--transport", "poll")
	for _, s := range seqs {
		if l := tl.next(t); l.Sequence != s {
			t.Fatalf("line %s: want sequence %d", l.raw, s)
		}
	}
	if rest, err := tl.signal(t, syscall.SIGTERM); err != nil || len(rest) != 0 {
		t.Fatalf("after SIGTERM: %v, lines %v", err, rest)
	}
	if got := readState(t, state); got != seqs[2] {
		t.Fatalf("state holds %d, want %d", got, seqs[2])
	}
	more := publish(t, d.base, "pub-1", "b", "after").Sequence
	tl = startTail(t, d.base, "--topic", "pub-1", "--state", state, "--cursor", "0")
	if l := tl.next(t); l.Sequence != more || string(l.Data) != `"after"` {
		t.Fatalf("first line after the restart %s: want sequence %d", l.raw, more)
	}
	if _, err := tl.signal(t, syscall.SIGINT); err != nil {
		t.Fatalf("after SIGINT: %v", err)
	}
}

// Bad flags exit 2 with one line naming the flag.
func TestTailPublishCmdBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"tail", "http://x", "--bogus"}, "-bogus"},
		{[]string{"tail", "http://x", "--transport", "ws"}, "--transport"},
		{[]string{"tail", "http://x", "--cursor", "ten"}, "-cursor"},
		{[]string{"tail"}, "URL"},
		{[]string{"tail", "nowhere"}, "URL"},
		{[]string{"tail", "--events", "http://x/e"}, "--transport auto"},
		{[]string{"publish", "http://x", "--topic", "a", "--data", "1"}, "--key"},
		{[]string{"publish", "http://x", "--key", "k", "--data", "1"}, "--topic"},
		{[]string{"publish", "http://x", "--key", "k", "--topic", "a"}, "--data"},
		{[]string{"publish", "http://x", "--key", "k", "--topic", "a", "--data", "{x"}, "--data"},
		{[]string{"publish", "--key", "k", "--topic", "a", "--data", "1"}, "URL"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			var stderr syncBuffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; stderr: %s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.flag) {
				t.Fatalf("stderr %q: want one line naming %s", stderr.String(), tc.flag)
			}
		})
	}
}

// replayd publish prints the answer and exits 0 only on 200.
func TestPublishCmdExitCodes(t *testing.T) {
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "p.db"))...)
	run := func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"publish", d.base}, args...)...)
		out, err := cmd.Output()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, string(out)
		case errors.As(err, &ee):
			return ee.ExitCode(), string(out)
		}
		t.Fatal(err)
		return 0, ""
	}
	code, out := run("--key", publishKey, "--topic", "room-1", "--type", "chat", "--id", "x1", "--data", `{"n":1}`)
	var a publishAnswer
	if code != 0 || json.Unmarshal([]byte(out), &a) != nil || a.Sequence == 0 || a.Duplicate {
		t.Fatalf("publish: exit %d, %q", code, out)
	}
	p := pollAll(t, d, "room-1")
	if len(p.Events) != 1 || p.Events[0].Type != "chat" || string(p.Events[0].Data) != `{"n":1}` {
		t.Errorf("published %+v", p.Events)
	}
	if code, out := run("--key", publishKey, "--topic", "room-1", "--id", "x1", "--data", `2`); code != 0 || !strings.Contains(out, `"duplicate":true`) {
		t.Errorf("repeated id: exit %d, %q", code, out)
	}
	if code, out := run("--key", "wrong", "--topic", "room-1", "--data", `1`); code != 1 || out == "" {
		t.Errorf("wrong key: exit %d, %q; want 1 and the answer", code, out)
	}
	if code, out := run("--key", roomKey, "--topic", "other", "--data", `1`); code != 1 || out == "" {
		t.Errorf("key outside its pattern: exit %d, %q; want 1 and the answer", code, out)
	}
	if code, out := run("--key", publishKey, "--topic", strings.Repeat("t", 5000), "--data", `1`); code != 1 || out == "" {
		t.Errorf("topic too long: exit %d, %q; want 1 and the answer", code, out)
	}
}

// A cursor the log does not know (a log restored or replaced) gets an
// unknown_cursor gap over each transport, without a range, and the events
// published after it follow.
func TestTailUnknownCursorGap(t *testing.T) {
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "u.db"))...)
	head := publish(t, d.base, "pub-u", "u0", 0).Sequence
	for _, transport := range []string{"sse", "poll"} {
		t.Run(transport, func(t *testing.T) {
			tl := startTail(t, d.base, "--transport", transport, "--topic", "pub-u", "--cursor", fmt.Sprint(head+1_000_000))
			if g := tl.next(t); g.Gap == nil || g.Gap.Reason != "unknown_cursor" || g.raw != `{"gap":{"reason":"unknown_cursor"}}` {
				t.Fatalf("first line %s: want an unknown_cursor gap", g.raw)
			}
			seq := publish(t, d.base, "pub-u", "after-"+transport, transport).Sequence
			if l := tl.next(t); l.Sequence != seq {
				t.Fatalf("line %s: want sequence %d", l.raw, seq)
			}
			if _, err := tl.signal(t, syscall.SIGTERM); err != nil {
				t.Errorf("after SIGTERM: %v", err)
			}
		})
	}
}

// A state file replayd tail could not have written is refused with exit
// status 2 and one line naming it, and left as it is: a negative or
// missing cursor would move the tail silently (to the head, skipping
// events without a gap, or back to the start). An empty file is no state
// yet: the tail starts from --cursor.
func TestTailRefusesBadState(t *testing.T) {
	d := start(t, nil, serveArgs(t, filepath.Join(t.TempDir(), "b.db"))...)
	seq := publish(t, d.base, "pub-b", "b0", "first").Sequence
	for _, content := range []string{
		`{"cursor":-5}`, `{"cursor":-1}`, `{}`, `null`, `[]`, `"x"`, `7`, `garbage`,
		`{"cursor":1.5}`, `{"cursor":"5"}`, `{"cursor":1,"extra":true}`, `{"cursor":1}{"cursor":2}`, "{\"cursor\":\n",
	} {
		t.Run(content, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "s.json")
			if err := os.WriteFile(state, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			tl := startTail(t, d.base, "--topic", "pub-b", "--state", state)
			select {
			case l, ok := <-tl.lines:
				if ok {
					t.Fatalf("the state was taken: printed %s", l.raw)
				}
				<-tl.done
			case <-time.After(waitFor):
				t.Fatalf("still running %v after starting with the state %q", waitFor, content)
			}
			var ee *exec.ExitError
			if !errors.As(tl.err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2", tl.err)
			}
			lines := strings.Split(strings.TrimSpace(tl.stderr.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], "--state") || !strings.Contains(lines[0], state) {
				t.Errorf("stderr %q: want one line naming --state and the file", tl.stderr.String())
			}
			if b, _ := os.ReadFile(state); string(b) != content {
				t.Errorf("the state file now holds %q", b)
			}
		})
	}
	for _, content := range []string{"", " \n"} {
		t.Run(fmt.Sprintf("empty %q", content), func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "s.json")
			if err := os.WriteFile(state, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			tl := startTail(t, d.base, "--topic", "pub-b", "--state", state, "--cursor", "0")
			if l := tl.next(t); l.Sequence != seq {
				t.Fatalf("line %s: want sequence %d", l.raw, seq)
			}
			if _, err := tl.signal(t, syscall.SIGTERM); err != nil {
				t.Fatalf("after SIGTERM: %v", err)
			}
			if got := readState(t, state); got != seq {
				t.Errorf("state holds %d, want %d", got, seq)
			}
		})
	}
}

// waitStderr waits until the tail's stderr holds s, and returns it.
func waitStderr(t *testing.T, tl *tailer, s string) string {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(waitFor)
	for {
		if e := tl.stderr.String(); strings.Contains(e, s) {
			return e
		}
		select {
		case <-tick.C:
		case <-tl.done:
			t.Fatalf("replayd tail exited (%v) without %q on stderr: %s", tl.err, s, tl.stderr.String())
		case <-timeout:
			t.Fatalf("no %q on stderr within %v: %q", s, waitFor, tl.stderr.String())
		}
	}
}

// A tail that cannot connect says so on stderr once, not at every retry,
// and "connected" when the server comes up; a refusal no retry can fix
// (401) ends it with exit status 1, naming the refusal.
func TestTailReportsConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there until the server starts
	tl := startTail(t, "http://"+addr, "--topic", "pub-c", "--transport", "sse")
	waitStderr(t, tl, "cannot connect to http://"+addr+"/events")
	time.Sleep(2 * time.Second) // the scenario: a server down for a while, retried several times meanwhile
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "c.db")), "--listen", addr)...)
	e := waitStderr(t, tl, "replayd tail: connected\n")
	if n := strings.Count(e, "cannot connect"); n != 1 || !strings.HasSuffix(e, "replayd tail: connected\n") {
		t.Errorf("stderr %q: want one cannot connect line, then connected", e)
	}
	seq := publish(t, d.base, "pub-c", "c0", 0).Sequence
	if l := tl.next(t); l.Sequence != seq {
		t.Fatalf("line %s: want sequence %d", l.raw, seq)
	}
	if _, err := tl.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}

	tl = startTail(t, d.base, "--topic", "room-1")
	select {
	case <-tl.done:
	case <-time.After(waitFor):
		t.Fatalf("a tail refused with 401 still running after %v", waitFor)
	}
	var ee *exec.ExitError
	if !errors.As(tl.err, &ee) || ee.ExitCode() != 1 || !strings.Contains(tl.stderr.String(), "401") {
		t.Errorf("refused: %v, stderr %q; want exit 1 naming the 401", tl.err, tl.stderr.String())
	}
}
