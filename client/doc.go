// Package client reads a replayd stream from Go, keeping replayd's promise
// on the client's side too: every event of the scope after the cursor is
// handed to the application once, in order, or named by a gap handed in
// its place; never a silent hole.
//
//	c := client.New(client.Options{
//		SSE:    "https://example.com/events",
//		Poll:   "https://example.com/poll",
//		Topics: []string{"room-42"},
//		Cursor: saved, // the last id the application has; 0: from the beginning
//	})
//	err := c.Run(ctx, func(m client.Message) error {
//		switch {
//		case m.Gap != nil:
//			return reloadSnapshot() // the state is incomplete
//		case m.Event != nil:
//			return apply(m.Event) // and store m.Event.ID with the state it changed
//		}
//		return nil
//	})
//
// # Transports
//
// A Client reads the SSE endpoint (EventHub.Handler), the poll endpoint
// (EventHub.PollHandler) in long polls, or, with Auto (the default when
// both URLs are given), SSE falling back to long polls for the rest of the
// Run when three connection attempts in a row end without a hello, or
// none arrives within 10 s: a proxy that buffers or refuses streams. Both
// transports share one cursor; switching loses and repeats nothing.
//
// # The cursor
//
// Options.Cursor is the id of the last event the application has. Its zero
// value, 0, is the beginning of the log: a new consumer gets everything
// retained (or a gap naming what was pruned), which is the safe default.
// FromHead starts fresh at the head instead. Cursor reports, at any
// moment and from any goroutine, the id of the last event the handler
// accepted (or the head, for a client that started FromHead, or after an
// unknown_cursor gap): persist it and pass it back as Options.Cursor to
// continue after a restart. Events at or below the cursor are never
// handed again, whatever the server sends.
//
// A gap never moves the cursor backwards either, wherever in a stream or
// poll answer it comes (replayd's server sends one only right after the
// hello, or at the head of a poll answer; another server or a proxy may
// not). Its range is clipped to what the application was not told yet:
// the part at or below the cursor is dropped (those events were handed,
// or named by an earlier gap), and so is any part above the highest
// sequence the server has shown (the hello's or the answer's head, or a
// later event). A gap with nothing left is not handed at all; a clipped
// one has MissedFrom raised to cursor+1 and Missed nil. After a gap with a
// range the cursor moves to its MissedThrough: the events it names are
// settled (the application reloads a snapshot), so a reconnect does not
// ask for them, or for the same gap, again, and events inside the range
// that a server still sends after the gap (a poll of several topics
// pruned differently may) are dropped as named. The one exception is an
// unknown_cursor or invalid_cursor gap, which starts another history: it
// moves the cursor to the head of the log being read, possibly below the
// cursor, when it comes before any event of its stream or answer, and
// leaves the cursor where it is when it comes after one.
//
// # Messages
//
// Run calls the handler on its own goroutine, one Message at a time: an
// Event, or a Gap. hello and heartbeat frames are not passed on. A gap
// says the application's state is incomplete (events were pruned, were
// beyond the server's replay limit, or the log did not know the cursor):
// reload a snapshot, then keep applying the events that follow. After an
// unknown_cursor or invalid_cursor gap the cursor moves to the head
// of the log being read (a log restored or replaced), and its events
// follow; after any other, past the gap's range (see The cursor).
//
// The handler holds the stream: nothing more is read until it returns. A
// slow handler is back-pressure, not a growing buffer: the server may end a
// stream that falls too far behind, and the client then resumes, with a
// gap if the server no longer replays what it missed. Memory is bounded:
// one frame (at most 4 MiB; a 1 MiB event is fine) or one poll answer (the
// server bounds its size) at a time.
//
// # Job streams
//
// A Job follows one job stream (replayd.Jobs, docs/jobs.md: an
// upstream's answer written to the log) through a Client, on either
// transport, and decodes its messages:
//
//	job := client.NewJob(client.JobOptions{
//		Options: client.Options{SSE: base + "/events", Poll: base + "/poll"},
//		Job:     "run-42",
//		State:   saved, // nil: from the job's start
//	})
//	end, err := job.Run(ctx, func(u client.JobUpdate) error {
//		if u.Text != nil {
//			fmt.Print(u.Text.Chunk)
//		}
//		return store(job.State()) // the cursor and everything it covers, together
//	})
//	if err == nil {
//		err = end.Err() // nil when complete; else a *JobError: failed, abandoned, interrupted...
//	}
//
// The text is rebuilt from each chunk's offset (UTF-16 code units, as the
// job counts): a chunk over text already held is cut to its new part or
// dropped, and one past it leaves a hole, named by a TextMissing gap and
// not padded. Events are handed once each, by number, in emit order (a
// missing one named by an EventsMissing gap); progress is the latest
// snapshot; the end is the last update, and Run returns it. JobState, the
// cursor together with the text, events, progress and gaps it covers,
// is the follower's whole memory: saved after an update (it encodes to
// JSON) and given to a new follower, it goes on exactly, with nothing
// lost and nothing twice. Over SSE, more missed than the server replays
// (a replay_limit gap) is read over polls instead when the Poll URL is
// given, as followJob does in the browser.
//
// # Endings and errors
//
// Run reconnects by itself after every end of a connection: a network
// error, a clean close by the server (a slow-consumer cut, a server
// shutting down or restarting), the overload answer (a stream with only a
// retry field), a 503 or other 5xx, 408 and 429, or an SSE connection
// silent for Options.IdleTimeout. It waits a delay drawn between 0 and an
// exponentially growing ceiling (full jitter: MinBackoff, doubling after
// each attempt that got no hello or poll answer, up to MaxBackoff), never
// less than the server's retry field or Retry-After. A poll answer that
// should move the cursor and does not (more owed but no events given, a
// gap or events at or below the cursor, on every answer: a misbehaving
// server or proxy) counts as such a failed attempt, so the client backs
// off instead of polling in a loop; the first answer that moves the cursor
// resets the backoff. An empty answer to a long poll is not a failure: the
// next poll follows at once, or after 1 s when the server did not hold
// the poll.
//
// Run returns only when its context ends (with ctx.Err(), promptly and
// with no goroutine left behind), when the handler returns an error (that
// error; the cursor stays before the refused message, so the next Run
// hands it again), when the Header hook returns an error, or on an answer
// no retry can fix: a *StatusError for 400, 401, 403, 404 and the other
// 4xx, and for 204 No Content, over SSE and polls alike: the answer that
// tells an EventSource to stop reconnecting for good, which the client
// obeys too (Auto does not fall back to polls on it). Authentication
// failures are not retried: a 401 or 403 returns, and the application
// refreshes its credentials (the Header hook is called on every request,
// so a token function can) and calls Run again, which goes on from the
// cursor.
package client
