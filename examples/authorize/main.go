// Command authorize shows who may see what with replayd: a session (a
// cookie, or an access token in the query, since EventSource cannot send
// headers) checked in Options.Authorize, per-user topics (user-42), a room
// membership check, and revocation with replayd.WithRevocation: logging out
// or leaving a room ends the affected streams at once, detached streams
// (SSEOptions.DetachConnections) included.
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

// access is a context that ends when some access is revoked: a session's
// on logout, a room membership's when the user leaves.
type access struct {
	ctx    context.Context
	revoke context.CancelFunc
}

func newAccess() access {
	ctx, cancel := context.WithCancel(context.Background())
	return access{ctx, cancel}
}

// session is one logged-in user.
type session struct {
	user string
	access
}

type app struct {
	mu       sync.Mutex
	sessions map[string]*session          // by token
	rooms    map[string]map[string]access // room -> member user id -> membership
}

type sessionKey struct{}

// withSession finds the request's session from the "session" cookie or the
// "access_token" query parameter and puts it on the request, with the
// contexts whose end revokes the request's access: the session's, and the
// membership of each room the request names. replayd ends the stream when
// one of them is done. A request without a session passes through;
// Authorize refuses it.
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
		ctx := context.WithValue(r.Context(), sessionKey{}, s)
		ctx = replayd.WithRevocation(ctx, s.ctx)
		for _, t := range r.URL.Query()["topic"] {
			if m, ok := a.rooms[strings.TrimSpace(t)][s.user]; ok {
				ctx = replayd.WithRevocation(ctx, m.ctx)
			}
		}
		a.mu.Unlock()
		next.ServeHTTP(w, r.WithContext(ctx))
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
		if _, member := a.rooms[t][s.user]; t != "user-"+s.user && !member {
			return fmt.Errorf("user %s may not see %q", s.user, t) // 403
		}
	}
	return nil
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
			"alice-token": {user: "42", access: newAccess()},
			"bob-token":   {user: "7", access: newAccess()},
		},
		rooms: map[string]map[string]access{
			"room-1": {"42": newAccess(), "7": newAccess()},
			"room-2": {"7": newAccess()},
		},
	}
	hub, err := replayd.New(db, replayd.Options{
		Authorize: a.authorize,
		// Detached streams are revoked like any other (WithRevocation).
		SSE: replayd.SSEOptions{DetachConnections: true},
	})
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
		s.revoke() // ends every stream of the session; they reconnect, and get 401
	})))
	mux.Handle("POST /rooms/{room}/leave", a.withSession(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, _ := r.Context().Value(sessionKey{}).(*session)
		if s == nil {
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		room := r.PathValue("room")
		a.mu.Lock()
		m, ok := a.rooms[room][s.user]
		delete(a.rooms[room], s.user)
		a.mu.Unlock()
		if ok {
			m.revoke() // ends the streams naming the room; they reconnect, and get 403
		}
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
