// Command authorize shows who may see what with replayd: a session (a
// cookie, or an access token in the query, since EventSource cannot send
// headers) checked in Options.Authorize, per-user topics (user-42), a room
// membership check, and revocation through the request's context: logging
// out or leaving a room ends the affected streams at once.
//
// Run it with
//
//	go run ./examples/authorize
//
// and try, from another terminal:
//
//	curl -N 'http://127.0.0.1:8080/events?topic=user-42'                       # 401
//	curl -N -b session=alice-token 'http://127.0.0.1:8080/events?topic=user-42&topic=room-1'
//	curl -N 'http://127.0.0.1:8080/events?topic=room-2&access_token=alice-token' # 403: not a member
//	curl -X POST -b session=alice-token http://127.0.0.1:8080/rooms/room-1/leave  # cuts her stream
//	curl -X POST -b session=alice-token http://127.0.0.1:8080/logout              # cuts every stream of hers
//
// A background publisher writes to user-42, room-1 and room-2 every second.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/replayd/replayd"
)

// session is one logged-in user. Its streams are the cancel functions of
// the request contexts it has open.
type session struct {
	user    string
	streams map[*http.Request]context.CancelFunc
}

type app struct {
	mu       sync.Mutex
	sessions map[string]*session        // by token
	rooms    map[string]map[string]bool // room -> member user ids
}

type sessionKey struct{}

// withSession finds the request's session from the "session" cookie or the
// "access_token" query parameter and ties the request's context to it: when
// the session ends or changes, cancel ends the stream (replayd watches
// r.Context()). A request without a session passes through; Authorize
// refuses it.
func (a *app) withSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := r.URL.Query().Get("access_token")
		if c, err := r.Cookie("session"); err == nil {
			token = c.Value
		}
		a.mu.Lock()
		s := a.sessions[token]
		if s == nil {
			a.mu.Unlock()
			next.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancel(context.WithValue(r.Context(), sessionKey{}, s))
		defer cancel()
		r = r.WithContext(ctx)
		s.streams[r] = cancel
		a.mu.Unlock()
		defer func() {
			a.mu.Lock()
			delete(s.streams, r)
			a.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// authorize is Options.Authorize: a user sees their own topic and the rooms
// they belong to, never the global scope. Its errors are logged at debug
// level, never sent.
func (a *app) authorize(r *http.Request, topics []string) error {
	s, _ := r.Context().Value(sessionKey{}).(*session)
	if s == nil {
		return replayd.ErrUnauthenticated // 401
	}
	if len(topics) == 0 {
		return errors.New("no one may see every topic") // 403
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range topics {
		if t != "user-"+s.user && !a.rooms[t][s.user] {
			return fmt.Errorf("user %s may not see %q", s.user, t) // 403
		}
	}
	return nil
}

// cut ends the open streams of user's sessions whose URL names topic ("":
// every stream). The EventSource reconnects with Last-Event-ID and
// Authorize decides again.
func (a *app) cut(user, topic string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.sessions {
		if s.user != user {
			continue
		}
		for r, cancel := range s.streams {
			if topic == "" || namesTopic(r, topic) {
				cancel()
			}
		}
	}
}

func namesTopic(r *http.Request, topic string) bool {
	for _, t := range r.URL.Query()["topic"] {
		if strings.TrimSpace(t) == topic {
			return true
		}
	}
	return false
}

func main() {
	dir, err := os.MkdirTemp("", "replayd-authorize-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := replayd.OpenDB(filepath.Join(dir, "events.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	a := &app{
		sessions: map[string]*session{
			"alice-token": {user: "42", streams: map[*http.Request]context.CancelFunc{}},
			"bob-token":   {user: "7", streams: map[*http.Request]context.CancelFunc{}},
		},
		rooms: map[string]map[string]bool{"room-1": {"42": true, "7": true}, "room-2": {"7": true}},
	}
	hub, err := replayd.New(db, replayd.Options{Authorize: a.authorize})
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()

	mux := http.NewServeMux()
	mux.Handle("/events", a.withSession(hub.Handler()))
	mux.Handle("POST /logout", a.withSession(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, _ := r.Context().Value(sessionKey{}).(*session)
		if s == nil {
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		a.mu.Lock()
		for token, t := range a.sessions {
			if t == s {
				delete(a.sessions, token)
			}
		}
		a.mu.Unlock()
		a.cut(s.user, "") // its other requests' contexts end now
	})))
	mux.Handle("POST /rooms/{room}/leave", a.withSession(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, _ := r.Context().Value(sessionKey{}).(*session)
		if s == nil {
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		room := r.PathValue("room")
		a.mu.Lock()
		delete(a.rooms[room], s.user)
		a.mu.Unlock()
		a.cut(s.user, room)
	})))

	go func() {
		for n := 0; ; n++ {
			for _, topic := range []string{"user-42", "room-1", "room-2"} {
				if _, err := hub.Publish(context.Background(), topic, map[string]any{"n": n, "topic": topic}); err != nil {
					return // the hub is closed
				}
			}
			time.Sleep(time.Second)
		}
	}()
	log.Print("listening on http://127.0.0.1:8080")
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
