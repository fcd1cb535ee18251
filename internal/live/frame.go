package live

import (
	"bytes"
	"strconv"

	"github.com/replayd/replayd/storage"
)

// SSE frames (PROTOCOL.md describes them). Every frame ends with a blank line; field
// values never hold CR or LF, because Publish rejects them in types and the
// data is split into one "data:" line per payload line.

// AppendEventFrame appends "id: <seq>\nevent: <type>\ndata: <payload>\n\n".
func AppendEventFrame(b []byte, ev storage.Event) []byte {
	b = append(b, "id: "...)
	b = strconv.AppendInt(b, ev.Sequence, 10)
	b = append(b, '\n')
	return AppendFrame(b, ev.Type, ev.Payload)
}

// AppendFrame appends an event frame without an id line.
func AppendFrame(b []byte, eventType string, data []byte) []byte {
	b = append(b, "event: "...)
	b = append(b, eventType...)
	b = append(b, '\n')
	return append(appendData(b, data), '\n')
}

// appendData writes data as one "data:" line per line. CR, LF and CRLF
// each end a line, as they do for an SSE parser, so an EventSource
// reassembles data joined by LF: byte for byte when data's line breaks are
// LF, and JSON's insignificant CR whitespace comes back as LF.
func appendData(b, data []byte) []byte {
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			b = append(b, "data: "...)
			b = append(b, data...)
			return append(b, '\n')
		}
		b = append(b, "data: "...)
		b = append(b, data[:i]...)
		b = append(b, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
}
