package replaydmcp

// The SDK's own tests of its MemoryEventStore (mcp/event_test.go of
// github.com/modelcontextprotocol/go-sdk v1.8.0), run against EventStore
// where they can be. Not ported:
//
//   - TestMemoryEventStoreState's three purge cases ("purge", "purge
//     append", "purge resize append") and its size checks: they assert the
//     memory store's internal state (debugString, nBytes) under its byte
//     budget, purged round-robin across streams by SetMaxBytes. A replayd
//     log has no byte budget and deletes only its oldest events (a prefix
//     of the whole log, by count or age): what is purged differs by design.
//     Its "appends" and "session close" cases are ported, through After.
//   - BenchmarkMemoryEventStore: see bench_test.go, which runs the memory
//     store and this one side by side.
//
// SetMaxBytes(n) becomes a Prune keeping the newest events that the memory
// store would keep; the markers Open writes are older than every data row,
// so they go first.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/replayd/replayd/storage"
)

// TestSDKStateAppendsAndSessionClose ports TestMemoryEventStoreState's
// "appends" and "session close" cases.
func TestSDKStateAppendsAndSessionClose(t *testing.T) {
	ctx := context.Background()
	for _, close := range []bool{false, true} {
		t.Run(fmt.Sprintf("close=%v", close), func(t *testing.T) {
			s := New(openSQLite(t, tempDB(t)), Options{})
			mustAppend(t, s, "S1", "1", "d1")
			mustAppend(t, s, "S1", "2", "d2")
			mustAppend(t, s, "S1", "1", "d3")
			mustAppend(t, s, "S2", "8", "d4")
			if close {
				if err := s.SessionClosed(ctx, "S1"); err != nil {
					t.Fatal(err)
				}
			}
			for _, tt := range []struct {
				session, stream string
				want            []string
			}{
				{"S1", "1", []string{"d1", "d3"}},
				{"S1", "2", []string{"d2"}},
				{"S2", "8", []string{"d4"}},
			} {
				got, err := collect(ctx, s, tt.session, tt.stream, -1)
				if close && tt.session == "S1" {
					if err == nil || !strings.Contains(err.Error(), "unknown session ID") {
						t.Errorf("%s %s after SessionClosed: got %v, %v; want an unknown session error", tt.session, tt.stream, got, err)
					}
					continue
				}
				if err != nil || !slices.Equal(got, tt.want) {
					t.Errorf("%s %s: got %v, %v; want %v", tt.session, tt.stream, got, err, tt.want)
				}
			}
		})
	}
}

// TestSDKAfter ports TestMemoryEventStoreAfter: d1 is purged.
func TestSDKAfter(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t, tempDB(t))
	s := New(st, Options{Retention: storage.RetentionPolicy{MaxEvents: 3}, PruneInterval: -1})
	mustOpen(t, s, "S1", "1", "2") // as the SDK does before appending
	mustAppend(t, s, "S1", "1", "d1", "d2", "d3")
	mustAppend(t, s, "S1", "2", "d4")

	// The memory store still knows every stream after its purge, since it
	// keeps empty lists; here the session's records go with the oldest
	// rows, after which an unknown stream of S1 reads as a stream that
	// never had data (an empty replay: nothing was lost). So the unknown
	// cases run first.
	for _, tt := range []struct {
		session, stream, wantErr string
	}{
		{"S1", "3", "unknown stream ID"},
		{"S2", "0", "unknown session ID"},
	} {
		if got, err := collect(ctx, s, tt.session, tt.stream, 0); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s-%s: got %v, %v; want an error containing %q", tt.session, tt.stream, got, err, tt.wantErr)
		}
	}

	// SetMaxBytes(4) purges d1: keep the newest three rows, d2 d3 d4.
	// Each Open wrote a record of the stream on the session's topic, so
	// the oldest three rows are those two and d1.
	if n, err := s.Prune(ctx); err != nil || n != 3 {
		t.Fatalf("Prune: %d, %v; want 3 deleted (2 records and d1)", n, err)
	}

	for _, tt := range []struct {
		sessionID string
		streamID  string
		index     int
		want      []string
		wantErr   bool // ErrEventsPurged
	}{
		{"S1", "1", -1, nil, true}, // d1 is gone (the memory store: start < 0)
		{"S1", "1", 0, []string{"d2", "d3"}, false},
		{"S1", "1", 1, []string{"d3"}, false},
		{"S1", "1", 2, nil, false},
		{"S1", "1", 3, nil, false},
		{"S1", "1", 100, nil, false}, // past the end of stream "1" (highest is 2)
		{"S1", "2", 0, nil, false},
		{"S1", "2", 1, nil, false},
		{"S1", "2", 100, nil, false},
	} {
		t.Run(fmt.Sprintf("%s-%s-%d", tt.sessionID, tt.streamID, tt.index), func(t *testing.T) {
			got, err := collect(ctx, s, tt.sessionID, tt.streamID, tt.index)
			if tt.wantErr {
				if !errors.Is(err, mcp.ErrEventsPurged) || got != nil {
					t.Fatalf("got %v, %v; want only ErrEventsPurged", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %q", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSDKPurgeEmpty ports TestMemoryEventStorePurgeEmpty: an empty chunk
// is stored (and replayed) as one, and purging it is no special case.
func TestSDKPurgeEmpty(t *testing.T) {
	ctx := context.Background()
	s := New(openSQLite(t, tempDB(t)), Options{Retention: storage.RetentionPolicy{MaxEvents: 1}, PruneInterval: -1})
	mustAppend(t, s, "S1", "1", "", "1234567890")
	if got, err := collect(ctx, s, "S1", "1", -1); err != nil || !slices.Equal(got, []string{"", "1234567890"}) {
		t.Fatalf("before the purge: got %q, %v", got, err)
	}
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := collect(ctx, s, "S1", "1", -1); !errors.Is(err, mcp.ErrEventsPurged) {
		t.Errorf("After(-1) once the empty chunk is purged: got %q, %v; want ErrEventsPurged", got, err)
	}
	if got, err := collect(ctx, s, "S1", "1", 0); err != nil || !slices.Equal(got, []string{"1234567890"}) {
		t.Errorf("After(0): got %q, %v", got, err)
	}
}
