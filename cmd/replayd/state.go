package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tailState is what `replayd tail --state FILE` keeps: the sequence of the
// last event it printed, and whether the line it may be writing now could
// be left torn by a kill.
type tailState struct {
	Cursor int64 `json:"cursor"`
	// Partial is set before the first line of a run that a kill could
	// tear (one larger than a pipe writes at once, or any line when stdout
	// is not a pipe), and kept until the run ends cleanly: the next run
	// then begins with a newline, which ends whatever was left of that
	// line.
	Partial bool `json:"partial,omitempty"`
}

// badStateError is a state file replayd tail could not have written: the
// command refuses it (exit status 2) and leaves it as it is.
type badStateError struct {
	path, content, why string
}

func (e *badStateError) Error() string {
	c := strings.Join(strings.Fields(e.content), " ") // one line
	if len(c) > 80 {
		c = c[:80] + "…"
	}
	return fmt.Sprintf("%s: %s: %s: replayd tail writes {\"cursor\":N} with N >= 0; fix the file, or remove it to start from --cursor", e.path, c, e.why)
}

// loadState reads the state file at path; ok is false when there is none
// yet: no file, or an empty one (white space only). Anything else must be
// what saveState writes, or loadState returns a *badStateError: a
// negative, missing or fractional cursor would otherwise move the tail
// silently (to the head, or to the start of the log).
func loadState(path string) (s tailState, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return s, false, nil
	}
	bad := func(why string) (tailState, bool, error) {
		return tailState{}, false, &badStateError{path: path, content: string(b), why: why}
	}
	var raw struct {
		Cursor  *int64 `json:"cursor"`
		Partial bool   `json:"partial"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&raw); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return bad("not JSON")
		case errors.As(err, &typ) && typ.Field == "cursor":
			return bad("the cursor is not an integer")
		case errors.As(err, &typ) && typ.Field != "":
			return bad(typ.Field + " is not " + typ.Type.String())
		case errors.As(err, &typ):
			return bad("not an object")
		}
		return bad(strings.TrimPrefix(err.Error(), "json: "))
	}
	if d.More() {
		return bad("data after the object")
	}
	switch {
	case b[0] != '{':
		return bad("not an object")
	case raw.Cursor == nil:
		return bad("no cursor")
	case *raw.Cursor < 0:
		return bad("a negative cursor")
	}
	return tailState{Cursor: *raw.Cursor, Partial: raw.Partial}, true, nil
}

// saveState replaces the state file at path atomically: a temporary file
// in the same directory, renamed over it, so a kill at any moment leaves
// the old state or the new one, never a torn file. It does not fsync: the
// promise is about the process being killed, not the machine losing power.
func saveState(path string, s tailState) error {
	b, _ := json.Marshal(s)
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := f.Write(append(b, '\n'))
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
