package wiretest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// WaitUntil polls cond until it holds, failing the test after WaitFor.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// LogRecorder is a slog.Handler keeping every record, for tests that
// assert what is logged.
type LogRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *LogRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *LogRecorder) WithGroup(string) slog.Handler            { return l }
func (l *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// Has reports whether a record at level or above holds msg in its message
// and, if key is not "", an attribute key whose value holds value.
func (l *LogRecorder) Has(level slog.Level, msg, key, value string) bool {
	return l.Count(level, msg, key, value) > 0
}

// Count returns how many records at level or above hold msg in their
// message and, if key is not "", an attribute key whose value holds value.
func (l *LogRecorder) Count(level slog.Level, msg, key, value string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level < level || !strings.Contains(r.Message, msg) {
			continue
		}
		found := key == ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key && strings.Contains(a.Value.String(), value) {
				found = true
			}
			return !found
		})
		if found {
			n++
		}
	}
	return n
}

// String lists the records, one a line: level, message, attributes.
func (l *LogRecorder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs {
		fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
		b.WriteByte('\n')
	}
	return b.String()
}

// Recorder records what a subscriber is told, in order, as strings; it is
// safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	items []string
	seen  chan struct{} // signalled after every item
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{seen: make(chan struct{}, 1)} }

// Add records s.
func (r *Recorder) Add(s string) {
	r.mu.Lock()
	r.items = append(r.items, s)
	r.mu.Unlock()
	select {
	case r.seen <- struct{}{}:
	default:
	}
}

// Snapshot returns what r holds.
func (r *Recorder) Snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.items)
}

// Wait waits until r holds n items and returns them, failing the test
// after WaitFor.
func (r *Recorder) Wait(t testing.TB, n int) []string {
	t.Helper()
	deadline := time.After(WaitFor)
	for {
		if got := r.Snapshot(); len(got) >= n {
			return got
		}
		select {
		case <-r.seen:
		case <-deadline:
			t.Fatalf("subscriber got %q, want %d items", r.Snapshot(), n)
		}
	}
}

// Seqs records the sequences a subscriber is given; it is safe for
// concurrent use.
type Seqs struct {
	mu   sync.Mutex
	seen []int64
}

// Add records seq.
func (s *Seqs) Add(seq int64) {
	s.mu.Lock()
	s.seen = append(s.seen, seq)
	s.mu.Unlock()
}

// Seen returns the sequences recorded so far.
func (s *Seqs) Seen() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}
