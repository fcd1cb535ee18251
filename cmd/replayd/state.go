package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// tailState is what `replayd tail --state FILE` keeps: the sequence of the
// last event it printed.
type tailState struct {
	Cursor int64 `json:"cursor"`
}

// loadState reads the state file at path; ok is false when there is none
// yet.
func loadState(path string) (s tailState, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, false, fmt.Errorf("%s: %w", path, err)
	}
	return s, true, nil
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
