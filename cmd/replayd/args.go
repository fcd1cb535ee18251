package main

import (
	"flag"
	"io"
	"strings"
)

// parseInterspersed parses args with fs, flags and positional arguments
// in any order (replayd tail URL --topic a), and returns the positional
// ones. A "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// flagError formats err from flag.Parse as the one line a bad flag gets:
// the flag package's message names the flag.
func flagError(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", " ")
}
