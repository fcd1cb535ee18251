package jobs

import (
	"io"
	"net/url"
)

var errEOF = io.EOF

func unescape(s string) (string, error) { return url.PathUnescape(s) }
