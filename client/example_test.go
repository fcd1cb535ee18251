package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/replayd/replayd"
	"github.com/replayd/replayd/client"
)

// exampleServer serves a hub on a temporary SQLite file at /events and
// /poll, with three events of room-42 and one of elsewhere published.
func exampleServer() (hub *replayd.EventHub, url string, cleanup func()) {
	dir, err := os.MkdirTemp("", "replayd-client-example-")
	if err != nil {
		log.Fatal(err)
	}
	db, err := replayd.OpenDB(filepath.Join(dir, "events.db"))
	if err != nil {
		log.Fatal(err)
	}
	hub, err = replayd.New(db, replayd.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for i, topic := range []string{"room-42", "elsewhere", "room-42", "room-42"} {
		if _, err := hub.Publish(ctx, topic, map[string]int{"n": i}); err != nil {
			log.Fatal(err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/events", hub.Handler())
	mux.Handle("/poll", hub.PollHandler())
	srv := httptest.NewServer(mux)
	return hub, srv.URL, func() {
		srv.Close()
		hub.Close()
		db.Close()
		os.RemoveAll(dir)
	}
}

// Read a topic from the beginning of the log, over SSE falling back to
// long polls, until the handler has what it wants.
func Example() {
	_, url, cleanup := exampleServer()
	defer cleanup()

	c := client.New(client.Options{
		SSE:    url + "/events",
		Poll:   url + "/poll",
		Topics: []string{"room-42"},
		// Cursor: 0, the zero value: from the beginning of the log.
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errEnough := errors.New("enough")
	data := map[int64]string{} // by event id; ids are the log's sequences, not counted from 1
	err := c.Run(ctx, func(m client.Message) error {
		switch {
		case m.Gap != nil:
			fmt.Println("gap:", m.Gap.Reason) // reload a snapshot here
		case m.Event != nil:
			fmt.Printf("event %s %s\n", m.Event.Type, m.Event.Data)
			data[m.Event.ID] = string(m.Event.Data)
			if string(m.Event.Data) == `{"n":3}` {
				return errEnough // not accepted: the cursor stays on the one before
			}
		}
		return nil
	})
	fmt.Println(err, "; cursor at", data[c.Cursor()])
	// Output:
	// event message {"n":0}
	// event message {"n":2}
	// event message {"n":3}
	// enough ; cursor at {"n":2}
}

// Persist the cursor and continue after a restart: a second client,
// started from the first one's cursor, gets only what followed it, over
// polls this time (the two transports share the cursor).
func ExampleClient_Cursor() {
	hub, url, cleanup := exampleServer()
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	stop := errors.New("stop")
	data := map[int64]string{} // by event id
	first := client.New(client.Options{SSE: url + "/events", Topics: []string{"room-42"}})
	first.Run(ctx, func(m client.Message) error {
		if m.Event != nil {
			data[m.Event.ID] = string(m.Event.Data)
			if string(m.Event.Data) == `{"n":2}` {
				return stop // a crash after {"n":0} was handled, before {"n":2}
			}
		}
		return nil
	})
	saved := first.Cursor() // an application writes it down with its state
	fmt.Println("saved cursor: the id of", data[saved])

	hub.Publish(ctx, "room-42", map[string]int{"n": 4})
	second := client.New(client.Options{Poll: url + "/poll", Topics: []string{"room-42"}, Cursor: saved})
	second.Run(ctx, func(m client.Message) error {
		fmt.Printf("event %s topic %s\n", m.Event.Data, m.Event.Topic)
		if string(m.Event.Data) == `{"n":4}` {
			return stop
		}
		return nil
	})
	// Output:
	// saved cursor: the id of {"n":0}
	// event {"n":2} topic room-42
	// event {"n":3} topic room-42
	// event {"n":4} topic room-42
}

// A token refreshed on every connection; a refusal (401, 403) ends Run
// with a *StatusError, since retrying the same credentials cannot help.
func ExampleOptions_header() {
	_, url, cleanup := exampleServer()
	defer cleanup()

	c := client.New(client.Options{
		SSE: url + "/nowhere", // this server answers 404 here
		Header: func(ctx context.Context, h http.Header) error {
			h.Set("Authorization", "Bearer "+"fresh-token") // e.g. from a token source
			return nil
		},
	})
	err := c.Run(context.Background(), func(client.Message) error { return nil })
	var se *client.StatusError
	if errors.As(err, &se) {
		fmt.Println("refused:", se.StatusCode)
	}
	// Output:
	// refused: 404
}

// Follow a job stream (replayd.Jobs, docs/jobs.md) to its end: its text
// as it is written, its events and progress, then how it ended. The state
// can be saved after every update and given back to a new follower.
func ExampleJob() {
	hub, url, cleanup := exampleServer()
	defer cleanup()
	jobs, err := hub.Jobs(replayd.JobsOptions{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	jobs.Start(ctx, "run-42", func(ctx context.Context, w *replayd.JobWriter) (any, error) {
		w.Progress(replayd.JobProgress{Phase: "generation"})
		w.Emit(map[string]string{"type": "tool.start", "name": "search"})
		for _, tok := range []string{"Hello", ", ", "world", " 👋"} {
			w.WriteString(tok)
		}
		return map[string]int{"tokens": 4}, nil
	})

	job := client.NewJob(client.JobOptions{
		Options: client.Options{SSE: url + "/events", Poll: url + "/poll"},
		Job:     "run-42",
		State:   nil, // or a state saved from job.State(): it goes on from there
	})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	end, err := job.Run(ctx, func(u client.JobUpdate) error {
		switch {
		case u.Event != nil:
			var e struct{ Type, Name string } // and the timestamp the server added
			json.Unmarshal(u.Event.Data, &e)
			fmt.Printf("event %d: %s %s\n", u.Event.N, e.Type, e.Name)
		case u.Gap != nil:
			fmt.Println("missing:", u.Gap.Reason)
		}
		_ = job.State() // what to save, with this update in it
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %q, meta %s\n", end.Status, job.Text(), end.Meta)
	// Output:
	// event 0: tool.start search
	// complete: "Hello, world 👋", meta {"tokens":4}
}
