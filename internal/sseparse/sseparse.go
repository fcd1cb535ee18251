// Package sseparse reads a text/event-stream into frames, by the WHATWG
// HTML standard's event-stream parsing rules (§9.2.6): a line ends at CR,
// LF or CRLF; a leading UTF-8 BOM is dropped; a line starting with a colon
// is a comment; "field: value" loses one space after the colon, and a line
// without a colon is a field with an empty value; data lines are joined
// with LF; an id holding NUL is ignored; a retry that is not all ASCII
// digits is ignored; a blank line ends a frame; an unterminated last frame
// is never returned.
//
// It is the one parser of the repository's tests and tools. Two choices
// differ from an EventSource, so that a test sees everything on the wire:
// a frame is returned whenever it had a field line, even with no data
// (a retry-only frame, say), and a frame's ID is its own id field, not the
// last event ID carried over from earlier frames.
package sseparse

import (
	"bytes"
	"errors"
	"io"
)

// Frame is one parsed frame. Its slices are valid until the next call of
// Reader.Next.
type Frame struct {
	ID    []byte
	HasID bool   // the frame had an id field without NUL, perhaps empty
	Event []byte // empty means "message", as in an EventSource
	Data  []byte // the data lines joined with LF
	Retry []byte // the last retry field made of ASCII digits only
}

// ErrLineTooLong is returned for a line longer than Reader.MaxLine.
var ErrLineTooLong = errors.New("sseparse: line too long")

// Reader reads frames from a stream.
type Reader struct {
	// Field, if set, is called with every field line's name and value
	// (after the colon and one space), known fields or not, before the
	// line is applied; an error it returns is returned by Next.
	Field func(name, value []byte) error
	// MaxLine bounds a line's length, in bytes; 0 means 4 MiB.
	MaxLine int

	r          io.Reader
	buf        []byte
	start, end int // unread bytes are buf[start:end]
	cr         int // the index of the first CR in buf[start:end], or end
	err        error
	skipLF     bool // the last line ended with CR: an LF after it is part of that end
	first      bool // no line returned yet: a BOM may lead
	f          Frame
	data       []byte // data lines, each with an LF after it
	pending    bool   // a field line was seen since the last blank line
}

// NewReader returns a Reader of r with a 4 KiB buffer to start with.
func NewReader(r io.Reader) *Reader { return NewReaderSize(r, 4<<10) }

// NewReaderSize returns a Reader of r with a buffer of size bytes to start
// with; it grows for a longer line, up to MaxLine.
func NewReaderSize(r io.Reader, size int) *Reader {
	return &Reader{r: r, buf: make([]byte, max(size, 16)), first: true}
}

// Next returns the next frame, or the error that ended the stream: io.EOF
// at its end (an unterminated last frame is dropped), or the reader's or
// Field's error. The frame is reused by the next call.
func (r *Reader) Next() (*Frame, error) {
	f := &r.f
	f.ID, f.HasID, f.Event, f.Retry = f.ID[:0], false, f.Event[:0], f.Retry[:0]
	r.data, r.pending = r.data[:0], false
	for {
		line, err := r.line()
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			if !r.pending {
				continue
			}
			f.Data = r.data
			if n := len(r.data); n > 0 {
				f.Data = r.data[:n-1]
			}
			return f, nil
		}
		if line[0] == ':' {
			continue
		}
		name, value := line, line[len(line):]
		for i, c := range line { // a field name is short: no search call
			if c == ':' {
				name, value = line[:i], line[i+1:]
				if len(value) > 0 && value[0] == ' ' {
					value = value[1:]
				}
				break
			}
		}
		if r.Field != nil {
			if err := r.Field(name, value); err != nil {
				return nil, err
			}
		}
		r.pending = true
		switch string(name) {
		case "data":
			r.data = append(append(r.data, value...), '\n')
		case "event":
			f.Event = append(f.Event[:0], value...)
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				f.ID, f.HasID = append(f.ID[:0], value...), true
			}
		case "retry":
			if digits(value) {
				f.Retry = append(f.Retry[:0], value...)
			}
		}
	}
}

func digits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// line returns the next line without its end; it is valid until the next
// call.
func (r *Reader) line() ([]byte, error) {
	for {
		if r.skipLF && r.start < r.end {
			if r.buf[r.start] == '\n' {
				r.start++
			}
			r.skipLF = false
		}
		b := r.buf[r.start:r.end]
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			i = len(b)
		}
		if c := r.cr - r.start; c < i {
			i = c
		}
		if i < len(b) {
			line := b[:i]
			r.start += i + 1
			if r.skipLF = b[i] == '\r'; r.skipLF {
				r.cr = r.findCR(r.start)
			}
			if r.first {
				r.first = false
				line = bytes.TrimPrefix(line, []byte("\xEF\xBB\xBF"))
			}
			return line, nil
		}
		if r.err != nil {
			return nil, r.err
		}
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
}

// findCR returns the index of the first CR in buf[from:end], or end. Most
// streams hold none: looking for one per read, not per line, keeps a line
// one search for its LF.
func (r *Reader) findCR(from int) int {
	if i := bytes.IndexByte(r.buf[from:r.end], '\r'); i >= 0 {
		return from + i
	}
	return r.end
}

// fill reads more into the buffer, moving or growing it for room.
func (r *Reader) fill() error {
	if r.start > 0 {
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.cr -= r.start
		r.start = 0
	}
	if r.end == len(r.buf) {
		limit := r.MaxLine
		if limit <= 0 {
			limit = 4 << 20
		}
		if len(r.buf) > limit {
			return ErrLineTooLong
		}
		r.buf = append(r.buf, make([]byte, min(len(r.buf), limit+1-len(r.buf)))...)
	}
	for range 100 {
		n, err := r.r.Read(r.buf[r.end:])
		if r.cr == r.end { // no CR before the new bytes
			r.end += n
			r.cr = r.findCR(r.end - n)
		} else {
			r.end += n
		}
		if err != nil {
			r.err = err
			return nil
		}
		if n > 0 {
			return nil
		}
	}
	r.err = io.ErrNoProgress
	return nil
}
