package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseFlags parses args with fs, flags and positional arguments in any
// order (replayd tail URL --topic a), and returns the positional ones. A
// "--" ends the flags. On -h or --help it prints usage and fs's flags to
// help and returns flag.ErrHelp; any other error is the one line a bad
// flag gets.
func parseFlags(fs *flag.FlagSet, args []string, usage string, help io.Writer) ([]string, error) {
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(help, usage)
		fs.SetOutput(help)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return nil, flag.ErrHelp
	}
	if err != nil {
		return nil, errors.New(flagError(err))
	}
	return pos, nil
}

// parseInterspersed parses args with fs, flags and positional arguments
// in any order, and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // parseFlags prints the help
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
