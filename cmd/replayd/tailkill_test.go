package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The exactly-once pipeline's promise: `replayd tail --state` killed with
// SIGKILL and restarted 20 times while events are published prints every
// event in order, losing none, and repeats at most the last line of each
// killed run.
func TestTailStateSurvivesSIGKILL(t *testing.T) {
	const runs = 20
	// A replay limit no restart reaches: every event is printed, none is
	// left to a gap (a tail built with -race starts slowly enough to fall
	// 100 events behind, the default limit); gaps are still checked.
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "k.db")), "--replay-limit", "100000")...)
	state := filepath.Join(t.TempDir(), "s.json")
	t0 := time.Now()

	// The publisher: one event every 2 ms until told to stop.
	var (
		mu        sync.Mutex // guards published, pubErr
		published []int64
		pubErr    error
	)
	stopPub, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopPub:
				return
			case <-tick.C:
			}
			seq, err := postEvent(d.base, "pub-k", fmt.Sprint("k", i), i)
			mu.Lock()
			if err != nil {
				pubErr = err
			} else {
				published = append(published, seq)
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	defer func() { close(stopPub); <-pubDone }()

	transports := []string{"sse", "poll", "auto"}
	var out [][]tailLine // each run's lines
	for r := range runs {
		tl := startTail(t, d.base, "--topic", "pub-k", "--state", state, "--transport", transports[r%len(transports)])
		var lines []tailLine
		for range 1 + rand.IntN(40) {
			lines = append(lines, tl.next(t))
		}
		rest, err := tl.signal(t, syscall.SIGKILL)
		if err == nil {
			t.Fatalf("run %d: exit status 0 after SIGKILL", r)
		}
		out = append(out, append(lines, rest...))
	}
	close(stopPub)
	<-pubDone
	stopPub = make(chan struct{}) // for the deferred close
	mu.Lock()
	want, err := published, pubErr
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	// The last run reads to the end and stops cleanly.
	tl := startTail(t, d.base, "--topic", "pub-k", "--state", state)
	var lines []tailLine
	for reached := int64(0); reached < want[len(want)-1]; {
		l := tl.next(t)
		lines = append(lines, l)
		reached = l.Sequence
		if l.Gap != nil && l.Gap.Through != nil {
			reached = *l.Gap.Through
		}
	}
	rest, err := tl.signal(t, syscall.SIGTERM)
	if err != nil || len(rest) != 0 {
		t.Fatalf("last run after SIGTERM: %v, lines %v", err, rest)
	}
	out = append(out, lines)

	// Concatenate, dropping a first line that repeats the previous run's
	// last; nothing else may repeat, everything must increase, and every
	// published event must be printed or inside a gap's range (a tail that
	// fell behind by more than the server's replay limit, as a slow one
	// under -race does).
	var (
		printed         = map[int64]bool{}
		ranges          [][2]int64
		last            int64 // the highest sequence printed or named by a gap
		before          int64 // last before the latest line
		repeats, total  int
		gaps, gapEvents int
	)
	for r, run := range out {
		total += len(run)
		for i, l := range run {
			if strings.HasPrefix(l.raw, "unparsable") {
				t.Fatalf("run %d line %d: %s", r, i, l.raw)
			}
			if i == 0 && r > 0 && len(out[r-1]) > 0 {
				prev := out[r-1][len(out[r-1])-1]
				if l.Gap == nil && prev.Gap == nil && l.Sequence == prev.Sequence ||
					l.Gap != nil && prev.Gap != nil && l.Gap.From != nil && prev.Gap.From != nil && *l.Gap.From == *prev.Gap.From {
					repeats++
					if l.Gap != nil {
						last = max(last, *l.Gap.Through)
					}
					continue
				}
			}
			floor := last
			if i == 0 && r > 0 {
				// A restart resumes from the state, which may be one line
				// behind: a gap may name the killed run's last line again.
				floor = before
			}
			before = last
			switch {
			case l.Gap != nil:
				if l.Gap.From == nil || l.Gap.Through == nil || *l.Gap.From <= floor || *l.Gap.Through < *l.Gap.From {
					t.Fatalf("run %d line %d: %s after %d", r, i, l.raw, floor)
				}
				ranges = append(ranges, [2]int64{*l.Gap.From, *l.Gap.Through})
				last = max(last, *l.Gap.Through)
				gaps++
			case l.Sequence <= last:
				t.Fatalf("run %d line %d: %s after %d: out of order or repeated", r, i, l.raw, last)
			default:
				printed[l.Sequence] = true
				last = l.Sequence
			}
		}
	}
	for _, seq := range want {
		if printed[seq] {
			delete(printed, seq)
			continue
		}
		inGap := false
		for _, g := range ranges {
			inGap = inGap || g[0] <= seq && seq <= g[1]
		}
		if !inGap {
			t.Fatalf("published sequence %d: neither printed nor named by a gap", seq)
		}
		gapEvents++
	}
	if len(printed) != 0 {
		t.Fatalf("printed events never published: %v", printed)
	}
	t.Logf("%d runs (%d SIGKILLed), %d events published, %d lines printed, %d repeated first lines, %d gaps naming %d events, %v",
		len(out), runs, len(want), total, repeats, gaps, gapEvents, time.Since(t0).Round(time.Millisecond))
}

// postEvent publishes one event with the tests' key and returns its
// sequence; it is safe in any goroutine (no testing.T).
func postEvent(base, topic, id string, data any) (int64, error) {
	body, _ := json.Marshal(map[string]any{"topic": topic, "id": id, "data": data})
	req, err := http.NewRequest(http.MethodPost, base+"/publish", strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+publishKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var a publishAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("publish %s: %d %v %+v", id, resp.StatusCode, err, a)
	}
	return a.Sequence, nil
}

// Lines larger than a pipe takes at once can be torn by a kill: runs of
// `replayd tail --state` share one stdout pipe (as in a shell loop) read
// slowly (8 KiB every 2 ms), and each is SIGKILLed while it is in the
// middle of writing a ~512 KB line. The next run ends the fragment with a
// newline before anything else, so every line is one JSON object, or a
// fragment that does not parse and is a prefix of the line after it (the
// same event again): a consumer that skips lines that do not parse loses
// nothing.
func TestTailStateLargeLinesSurviveSIGKILL(t *testing.T) {
	const kills = 5
	d := start(t, nil, append(serveArgs(t, filepath.Join(t.TempDir(), "l.db")), "--replay-limit", "100000")...)
	state := filepath.Join(t.TempDir(), "s.json")
	var want []int64
	for i := range 24 {
		var data any = i
		if i%4 != 0 {
			data = fmt.Sprint(i, strings.Repeat("€", 170_000)) // ~510 KB, a fragment may cut a character
		}
		seq, err := postEvent(d.base, "pub-l", fmt.Sprint("l", i), data)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, seq)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	// The consumer: what it read, and in order, each complete line and
	// each time it is 16 KiB into a line it has not seen the end of.
	type seen struct {
		line []byte // nil: deep into an unfinished line
	}
	events := make(chan seen, 4096)
	var all bytes.Buffer // the whole stream, read once events is closed
	go func() {
		defer close(events)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		buf := make([]byte, 8<<10)
		var cur []byte
		deep := false
		for range tick.C {
			n, err := pr.Read(buf)
			all.Write(buf[:n])
			for _, b := range buf[:n] {
				if b == '\n' {
					events <- seen{line: append([]byte{}, cur...)}
					cur, deep = cur[:0], false
					continue
				}
				cur = append(cur, b)
			}
			if !deep && len(cur) >= 16<<10 {
				deep = true
				events <- seen{}
			}
			if err != nil {
				return
			}
		}
	}()
	next := func() seen {
		t.Helper()
		select {
		case s, ok := <-events:
			if !ok {
				t.Fatal("the consumer's pipe ended")
			}
			return s
		case <-time.After(waitFor):
			t.Fatalf("nothing read within %v", waitFor)
		}
		return seen{}
	}
	run := func() (*exec.Cmd, chan error, *syncBuffer) {
		t.Helper()
		cmd := exec.Command(bin, "tail", d.base, "--topic", "pub-l", "--state", state, "--transport", "sse")
		stderr := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = pw, stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill(); <-done })
		return cmd, done, stderr
	}
	wait := func(done chan error, stderr *syncBuffer) error {
		t.Helper()
		select {
		case err := <-done:
			done <- err
			return err
		case <-time.After(waitFor):
			t.Fatalf("replayd tail still running after %v; stderr: %s", waitFor, stderr.String())
		}
		return nil
	}
	for r := range kills {
		cmd, done, stderr := run()
		for parsed := 0; parsed < 1+r%2; {
			if s := next(); s.line != nil && json.Valid(s.line) {
				parsed++
			}
		}
		for next().line != nil {
		}
		cmd.Process.Signal(syscall.SIGKILL)
		if err := wait(done, stderr); err == nil {
			t.Fatalf("run %d: exit status 0 after SIGKILL", r)
		}
	}
	cmd, done, stderr := run()
	for {
		var l tailLine
		if s := next(); s.line != nil && json.Unmarshal(s.line, &l) == nil && l.Sequence == want[len(want)-1] {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := wait(done, stderr); err != nil {
		t.Fatalf("last run after SIGTERM: %v; stderr: %s", err, stderr.String())
	}
	pw.Close()
	for range events {
	}

	lines := strings.Split(strings.TrimSuffix(all.String(), "\n"), "\n")
	var got []int64
	fragments, blanks := 0, 0
	for i, l := range lines {
		var tl tailLine
		switch {
		case l == "":
			blanks++
		case json.Unmarshal([]byte(l), &tl) == nil:
			if tl.Gap != nil {
				t.Fatalf("line %d: a gap %.200s", i, l)
			}
			if len(got) > 0 && tl.Sequence < got[len(got)-1] {
				t.Fatalf("line %d: sequence %d after %d", i, tl.Sequence, got[len(got)-1])
			}
			if len(got) == 0 || tl.Sequence != got[len(got)-1] {
				got = append(got, tl.Sequence)
			}
		default:
			fragments++
			if i+1 == len(lines) || !strings.HasPrefix(lines[i+1], l) || !json.Valid([]byte(lines[i+1])) {
				t.Fatalf("line %d (%d bytes, %.60q…) does not parse and is not a prefix of the whole line after it", i, len(l), l)
			}
		}
	}
	if fragments != kills {
		t.Errorf("%d torn lines, want %d (one per kill)", fragments, kills)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("printed sequences %v, want %v", got, want)
	}
	t.Logf("%d lines, %d MB, %d torn by %d kills, %d blank", len(lines), all.Len()>>20, fragments, kills, blanks)
}
