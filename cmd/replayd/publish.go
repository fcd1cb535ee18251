package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// publishConfig is `replayd publish`'s command line.
type publishConfig struct {
	url                 string
	key, topic, typ, id string
	data                json.RawMessage
}

// publishUsage heads `replayd publish --help`.
const publishUsage = `Usage: replayd publish URL --key KEY --topic TOPIC --data JSON [flags]

Publishes one event with POST URL/publish and prints the server's answer.
Exit status 0 only on 200; 1 otherwise (the answer names the refusal);
2 on a bad flag. See docs/server.md.

Flags:
`

// parsePublish parses `replayd publish`'s command line; on --help it
// prints the usage to help and returns flag.ErrHelp.
func parsePublish(args []string, help io.Writer) (publishConfig, error) {
	var c publishConfig
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	fs.StringVar(&c.key, "key", "", "the publish `key` (required)")
	fs.StringVar(&c.topic, "topic", "", "the event's `topic` (required; \"\": a broadcast)")
	data := fs.String("data", "", "the event's payload, as `JSON` (required; a string is quoted: '\"text\"')")
	fs.StringVar(&c.typ, "type", "", "the event's `type` (default message)")
	fs.StringVar(&c.id, "id", "", "the event's idempotency `id` (default: a fresh one; give your own to retry safely)")
	pos, err := parseFlags(fs, args, publishUsage, help)
	if err != nil {
		return c, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range []string{"key", "topic", "data"} {
		if !set[name] {
			return c, fmt.Errorf("--%s: missing", name)
		}
	}
	if c.key == "" {
		return c, errors.New("--key: empty")
	}
	if !json.Valid([]byte(*data)) {
		return c, fmt.Errorf("--data %q: not JSON (a string is quoted: '\"text\"')", *data)
	}
	c.data = json.RawMessage(*data)
	if len(pos) != 1 {
		if len(pos) > 1 {
			return c, fmt.Errorf("unexpected argument %q", pos[1])
		}
		return c, errors.New("URL: missing (replayd publish URL --key K --topic T --data JSON)")
	}
	if u, err := url.Parse(pos[0]); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("URL %q: want http(s)://host[:port][/path]", pos[0])
	}
	c.url = strings.TrimSuffix(pos[0], "/") + "/publish"
	return c, nil
}

// publish runs `replayd publish`: one POST /publish, its answer printed;
// exit status 0 only on 200.
func publish(args []string, stdout, stderr io.Writer) int {
	c, err := parsePublish(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "replayd publish: %v\n", err)
		return 2
	}
	body, _ := json.Marshal(struct {
		Topic string          `json:"topic"`
		Type  string          `json:"type,omitempty"`
		ID    string          `json:"id,omitempty"`
		Data  json.RawMessage `json:"data"`
	}{c.topic, c.typ, c.id, c.data})
	req, err := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		fmt.Fprintf(stderr, "replayd publish: %v\n", err)
		return 1
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "replayd publish: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		fmt.Fprintf(stderr, "replayd publish: %v\n", err)
		return 1
	}
	stdout.Write(answer)
	if len(answer) > 0 && answer[len(answer)-1] != '\n' {
		fmt.Fprintln(stdout)
	}
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "replayd publish: %s\n", resp.Status)
		return 1
	}
	return 0
}
