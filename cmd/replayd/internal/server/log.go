package server

import (
	"io"
	"log/slog"
	"os"
)

// NewLogger logs JSON to w, or text when w is a terminal. Nothing the
// server logs holds a payload, a key or a token.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return slog.New(slog.NewTextHandler(w, opts))
		}
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
