package sseparse

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

type got struct {
	ID    string
	HasID bool
	Event string
	Data  string
	Retry string
}

// all parses s whole, and again one byte a read, and checks both agree.
func all(t *testing.T, s string) ([]got, error) {
	t.Helper()
	var runs [2][]got
	var errs [2]error
	for i, r := range []io.Reader{strings.NewReader(s), iotest.OneByteReader(strings.NewReader(s))} {
		rd := NewReaderSize(r, 16)
		for {
			f, err := rd.Next()
			if err != nil {
				errs[i] = err
				break
			}
			runs[i] = append(runs[i], got{string(f.ID), f.HasID, string(f.Event), string(f.Data), string(f.Retry)})
		}
	}
	if fmt.Sprint(runs[0]) != fmt.Sprint(runs[1]) || !errors.Is(errs[1], errs[0]) {
		t.Fatalf("%q: whole %v %v, byte by byte %v %v", s, runs[0], errs[0], runs[1], errs[1])
	}
	return runs[0], errs[0]
}

func TestFrames(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []got
	}{
		{"id: 1\nevent: hello\ndata: {}\n\n", []got{{"1", true, "hello", "{}", ""}}},
		{"data: a\r\ndata: b\rdata:c\n\r\n", []got{{Data: "a\nb\nc"}}},
		{"data: a\r\r", []got{{Data: "a"}}},
		{"\xEF\xBB\xBFdata: x\n\n", []got{{Data: "x"}}},
		{"data:  two spaces\n\n", []got{{Data: " two spaces"}}},
		{"data\n\n", []got{{Data: ""}}},
		{"data\ndata\n\n", []got{{Data: "\n"}}},
		{": comment\n\n:another\n\n", nil},
		{"retry: 10\n\n", []got{{Retry: "10"}}},
		{"retry: 1x\n\n", []got{{}}},
		{"retry: \n\n", []got{{}}},
		{"id: a\x00b\n\n", []got{{}}},
		{"id\n\n", []got{{HasID: true}}},
		{"id: 1\ndata: a\n\ndata: b\n\n", []got{{"1", true, "", "a", ""}, {Data: "b"}}},
		{"unknown: x\n\n", []got{{}}},
		{"\n\n\ndata: a\n\n\n", []got{{Data: "a"}}},
		{"data: a\n\ndata: unterminated\n", []got{{Data: "a"}}},
		{"data: a\n\ndata: unterminated", []got{{Data: "a"}}},
		{"event: a\nevent: b\n\n", []got{{Event: "b"}}},
	} {
		fs, err := all(t, c.in)
		if !errors.Is(err, io.EOF) {
			t.Fatalf("%q: %v", c.in, err)
		}
		if fmt.Sprint(fs) != fmt.Sprint(c.want) {
			t.Errorf("%q: got %+v, want %+v", c.in, fs, c.want)
		}
	}
}

func TestField(t *testing.T) {
	var names []string
	bad := errors.New("bad field")
	r := NewReader(strings.NewReader("id: 1\nx:y\ndata: z\n\n"))
	r.Field = func(name, value []byte) error {
		names = append(names, string(name)+"="+string(value))
		if string(name) == "x" {
			return bad
		}
		return nil
	}
	if _, err := r.Next(); !errors.Is(err, bad) {
		t.Fatalf("Next: %v", err)
	}
	if fmt.Sprint(names) != "[id=1 x=y]" {
		t.Fatalf("fields %v", names)
	}
}

func TestLineTooLong(t *testing.T) {
	long := "data: " + strings.Repeat("x", 100) + "\n\n"
	r := NewReaderSize(strings.NewReader(long), 16)
	r.MaxLine = 106
	if f, err := r.Next(); err != nil || len(f.Data) != 100 {
		t.Fatalf("a line of MaxLine bytes: %v", err)
	}
	r = NewReaderSize(strings.NewReader(long), 16)
	r.MaxLine = 105
	if _, err := r.Next(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("a line over MaxLine: %v", err)
	}
}

func TestReaderError(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("data: a\n\ndata: b\n"), iotest.ErrReader(boom)))
	if f, err := r.Next(); err != nil || string(f.Data) != "a" {
		t.Fatalf("first: %v", err)
	}
	if _, err := r.Next(); !errors.Is(err, boom) {
		t.Fatalf("second: %v", err)
	}
}

// BenchmarkNext parses frames shaped like replayd's events.
func BenchmarkNext(b *testing.B) {
	frame := "id: 123456\nevent: message\ndata: {\"t\":1764500000000000000,\"pad\":\"xxxxxxxxxxxxxxxxxxxx\"}\n\n"
	stream := strings.Repeat(frame, 1000)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	sr := strings.NewReader(stream)
	for b.Loop() {
		sr.Reset(stream)
		r := NewReader(sr)
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
	}
}

// chunkReader returns its bytes in reads of the given sizes, in turn.
type chunkReader struct {
	b     []byte
	sizes []byte
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(c.sizes) > 0 {
		n = int(c.sizes[c.i%len(c.sizes)]) + 1
		c.i++
	}
	n = min(n, len(p), len(c.b))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

// FuzzSplits checks that where a stream is split into reads never changes
// its frames: a CR at the end of one read and an LF at the start of the
// next are one line end.
func FuzzSplits(f *testing.F) {
	f.Add([]byte("id: 1\r\nevent: hello\r\ndata: {}\r\n\r\n"), []byte{0, 3, 1})
	f.Add([]byte("data: a\r\rdata: b\n\n: c\r\n"), []byte{6})
	f.Add([]byte("\xEF\xBB\xBFretry: 10\n\n"), []byte{1})
	f.Fuzz(func(t *testing.T, b, sizes []byte) {
		parse := func(r io.Reader) (out []string, err error) {
			rd := NewReaderSize(r, 16)
			for {
				fr, err := rd.Next()
				if err != nil {
					return out, err
				}
				out = append(out, fmt.Sprintf("%q %v %q %q %q", fr.ID, fr.HasID, fr.Event, fr.Data, fr.Retry))
			}
		}
		whole, err1 := parse(strings.NewReader(string(b)))
		split, err2 := parse(&chunkReader{b: b, sizes: sizes})
		if fmt.Sprint(whole) != fmt.Sprint(split) || err1 != err2 {
			t.Fatalf("whole: %v %v; split %v: %v %v", whole, err1, sizes, split, err2)
		}
	})
}
