package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/replayd/replayd"
)

// Config is what `replayd serve` runs with: its flags, each also read from
// the environment as REPLAYD_<FLAG>.
type Config struct {
	Listen   string // address to listen on
	DB       string // SQLite file
	Postgres string // PostgreSQL DSN; set: DB is not used
	PGPrefix string // PostgreSQL table prefix; empty: replaydpg's default

	PublishKeys []PublishKey // who may publish where

	TokenKeyFile     string // HS256 secret or PEM public key; empty: only public topics are readable
	TokenIssuer      string // required iss, when set
	TokenAudience    string // required aud, when set
	TokenOptionalExp bool   // accept tokens without exp
	PublicTopics     Patterns

	AllowOrigins []string

	RetentionMaxAge    time.Duration
	RetentionMaxEvents int64
	RetentionTopics    []replayd.TopicPolicy // --retention-topic, in order: first match wins

	ReplayLimit       int
	MaxConnections    int
	MaxTCPConnections int // most open connections of any kind; beyond it one is closed at once

	ReadHeaderTimeout time.Duration // for a request's headers
	ReadTimeout       time.Duration // for a request body, POST /publish's above all
	IdleTimeout       time.Duration // a keep-alive connection between requests

	MaxTopics    int
	Heartbeat    time.Duration
	Retry        time.Duration
	PollMaxWait  time.Duration
	TailInterval time.Duration
	MaxBody      int64
	Detach       bool
	LogLevel     slog.Level

	// StreamsPrefix is where the Durable Streams handler is mounted ("":
	// not at all); StreamsDev opens it to every read and write.
	StreamsPrefix string
	StreamsDev    bool
}

// UsageError is a bad flag or value: the command exits with status 2.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &UsageError{fmt.Sprintf(format, a...)} }

// ErrHelp is returned by ParseServe for -h and --help.
var ErrHelp = flag.ErrHelp

// ParseServe reads the serve command's flags from args and, for every flag
// not given there, from getenv("REPLAYD_<FLAG>"). Every error is a
// *UsageError naming the flag, or ErrHelp.
func ParseServe(args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	c := Config{
		Listen:        "127.0.0.1:8080",
		DB:            "replayd.db",
		MaxBody:       16 << 20,
		ReplayLimit:   100,
		Heartbeat:     15 * time.Second,
		PollMaxWait:   30 * time.Second,
		MaxTopics:     32,
		TailInterval:  time.Second,
		StreamsPrefix: "/v1/stream/",

		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       90 * time.Second,
	}
	fs := flag.NewFlagSet("replayd serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var keys, origins, topicRetention multiFlag
	var public, level, keyFile string
	var maxBody sizeFlag = sizeFlag(c.MaxBody)
	fs.StringVar(&c.Listen, "listen", c.Listen, "`address` to listen on")
	fs.StringVar(&c.DB, "db", c.DB, "SQLite database `file`")
	fs.StringVar(&c.Postgres, "postgres", "", "PostgreSQL `DSN` (several nodes on one database); replaces --db")
	fs.Var(&keys, "publish-key", "publish `KEY` or KEY=PATTERN[,PATTERN...] (repeatable): a bare key publishes anywhere; split at the last =, so a base64 key ending in = needs =PATTERN; make keys with openssl rand -hex 32")
	fs.StringVar(&keyFile, "publish-key-file", "", "`file` of publish keys, one a line: KEY, or KEY PATTERN[,PATTERN...] after white space (any key, = included); # starts a comment line")
	fs.StringVar(&c.PGPrefix, "postgres-table-prefix", "", "with --postgres: the tables' name `prefix` (default replayd_)")
	fs.StringVar(&c.TokenKeyFile, "token-key", "", "subscriber token key `file`: an HS256 secret, or a PEM public key (RS256, ES256, EdDSA)")
	fs.StringVar(&c.TokenIssuer, "token-issuer", "", "required token `iss`")
	fs.StringVar(&c.TokenAudience, "token-audience", "", "required token `aud`")
	fs.BoolVar(&c.TokenOptionalExp, "token-optional-exp", false, "accept tokens without exp")
	fs.StringVar(&public, "public-topics", "", "`PATTERN[,PATTERN...]` readable without a token")
	fs.Var(&origins, "allow-origin", "allowed browser `origin` (repeatable; * for any)")
	fs.DurationVar(&c.RetentionMaxAge, "retention-max-age", 0, "delete events older than this `duration` (0: keep)")
	fs.Int64Var(&c.RetentionMaxEvents, "retention-max-events", 0, "keep at most this many newest `events` (0: keep all)")
	fs.Var(&topicRetention, "retention-topic", "`PATTERN=LIMITS` (repeatable; the first that matches a topic governs it, the other retention flags then the rest): LIMITS max-age=DURATION and/or max-events=N (of each matching topic), comma-separated, or keep (never pruned); PATTERN a topic or PREFIX*")
	fs.IntVar(&c.ReplayLimit, "replay-limit", c.ReplayLimit, "most `events` replayed on a reconnect before a gap")
	fs.IntVar(&c.MaxConnections, "max-connections", 0, "most open streams and waiting polls, answered as overloaded beyond it (0: no cap; --max-tcp-connections caps all connections)")
	fs.IntVar(&c.MaxTCPConnections, "max-tcp-connections", 0, "most open TCP `connections` of any kind, idle keep-alives included; one beyond it is closed at once (0: no cap)")
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", c.ReadHeaderTimeout, "longest wait for a request's headers; the connection is closed then (0: none)")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", c.ReadTimeout, "longest read of a request body, then the connection is closed (POST /publish answers 408) (0: none); streams and polls are never cut by it")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "longest an idle keep-alive connection is kept open between requests (0: none)")
	fs.IntVar(&c.MaxTopics, "max-topics", c.MaxTopics, "most topics in one request")
	fs.DurationVar(&c.Heartbeat, "heartbeat", c.Heartbeat, "heartbeat `interval` (negative: none)")
	fs.DurationVar(&c.Retry, "retry", 0, "reconnect `delay` told to EventSource clients (0: the browser's default)")
	fs.DurationVar(&c.PollMaxWait, "poll-max-wait", c.PollMaxWait, "longest long poll")
	fs.DurationVar(&c.TailInterval, "tail-interval", c.TailInterval, "with --postgres: fallback poll for other nodes' events")
	fs.Var(&maxBody, "max-body", "largest POST /publish `body` (bytes, or with KiB, MiB, GiB)")
	fs.BoolVar(&c.Detach, "detach", false, "serve HTTP/1.1 streams on the detached connection (less memory per stream)")
	fs.StringVar(&c.StreamsPrefix, "streams-prefix", c.StreamsPrefix, "`path` the Durable Streams protocol is served at (\"\": off); writes need a publish key covering the stream, reads a token or --public-topics")
	fs.BoolVar(&c.StreamsDev, "streams-dev", false, "open Durable Streams to every read and write, with no key or token: for local development and the protocol's conformance suite only")
	fs.StringVar(&level, "log-level", "info", "`level`: debug, info, warn or error")
	fs.Usage = func() {} // errors are reported by the caller, in one line
	printUsage := func() {
		fmt.Fprintf(usage, "Usage: replayd serve [flags]\n\nEach flag is also read from REPLAYD_<FLAG> (a flag given here wins).\n\n")
		fs.SetOutput(usage)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage()
			return c, ErrHelp
		}
		return c, usagef("%v", strings.Replace(err.Error(), " -", " --", 1))
	}
	if fs.NArg() > 0 {
		return c, usagef("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var envErr error
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	for _, name := range names {
		if given[name] || envErr != nil {
			continue
		}
		env := "REPLAYD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		v := getenv(env)
		if v == "" {
			continue
		}
		values := []string{v}
		if name == "publish-key" || name == "allow-origin" || name == "retention-topic" {
			values = strings.Fields(v)
		}
		for _, v := range values {
			if err := fs.Set(name, v); err != nil {
				envErr = usagef("invalid value for --%s in %s: %v", name, env, err)
				break
			}
		}
		given[name] = true
	}
	if envErr != nil {
		return c, envErr
	}
	c.MaxBody = int64(maxBody)
	if c.MaxBody <= 0 {
		return c, usagef("--max-body must be positive")
	}
	for _, k := range keys {
		pk, err := parsePublishKey(k)
		if err != nil {
			return c, usagef("--publish-key: %v", err)
		}
		c.PublishKeys = append(c.PublishKeys, pk)
	}
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return c, usagef("--publish-key-file: %v", err)
		}
		ks, err := parsePublishKeyFile(string(b))
		if err != nil {
			return c, usagef("--publish-key-file %s: %v", keyFile, err)
		}
		c.PublishKeys = append(c.PublishKeys, ks...)
	}
	c.AllowOrigins = origins
	for _, v := range topicRetention {
		tp, err := parseTopicRetention(v)
		if err != nil {
			return c, usagef("--retention-topic: %v", err)
		}
		c.RetentionTopics = append(c.RetentionTopics, tp)
	}
	if public != "" {
		p, err := ParsePatterns(public)
		if err != nil {
			return c, usagef("--public-topics: %v", err)
		}
		c.PublicTopics = p
	}
	if err := c.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return c, usagef("--log-level: %q is not debug, info, warn or error", level)
	}
	switch {
	case given["db"] && given["postgres"]:
		return c, usagef("--db and --postgres exclude each other")
	case c.Postgres == "" && c.DB == "":
		return c, usagef("--db: empty")
	case c.RetentionMaxAge < 0:
		return c, usagef("--retention-max-age must not be negative")
	case c.RetentionMaxEvents < 0:
		return c, usagef("--retention-max-events must not be negative")
	case c.Retry < 0:
		return c, usagef("--retry must not be negative")
	case c.MaxConnections < 0:
		return c, usagef("--max-connections must not be negative")
	case c.MaxTCPConnections < 0:
		return c, usagef("--max-tcp-connections must not be negative")
	case c.ReadHeaderTimeout < 0:
		return c, usagef("--read-header-timeout must not be negative")
	case c.ReadTimeout < 0:
		return c, usagef("--read-timeout must not be negative")
	case c.IdleTimeout < 0:
		return c, usagef("--idle-timeout must not be negative")
	case c.MaxTopics < 1:
		return c, usagef("--max-topics must be at least 1")
	case c.TailInterval <= 0:
		return c, usagef("--tail-interval must be positive")
	case c.TokenKeyFile == "" && (c.TokenIssuer != "" || c.TokenAudience != ""):
		return c, usagef("--token-issuer and --token-audience need --token-key")
	}
	return c, nil
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, " ") }

func (m *multiFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("empty")
	}
	*m = append(*m, v)
	return nil
}

// sizeFlag is a byte count, with an optional KiB, MiB or GiB suffix.
type sizeFlag int64

func (s *sizeFlag) String() string { return strconv.FormatInt(int64(*s), 10) }

func (s *sizeFlag) Set(v string) error {
	mult := int64(1)
	for suffix, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(v, suffix) {
			v, mult = strings.TrimSuffix(v, suffix), m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return errors.New("not a positive size (bytes, or with KiB, MiB, GiB)")
	}
	*s = sizeFlag(n * mult)
	return nil
}
