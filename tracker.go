package replayd

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// TopicClientTracker counts a hub's active SSE connections per topic, with
// global connections under "", and remembers when each topic last had a
// connection open or close. A connection on several topics counts under
// each of them, and once in Total. It is safe for concurrent use.
//
// Clients choose topic names, so a topic with no connections is forgotten
// once it has been idle for more than an hour, or when it is not among the
// newest 10,000 idle topics: memory and Snapshot's cost are bounded by the
// connections open plus 10,000, however many topics were ever requested.
type TopicClientTracker struct {
	mu     sync.Mutex             // guards every field below
	topics map[string]*topicEntry // topics with clients, and recent idle ones
	idle   topicEntry             // sentinel of the idle list, oldest first
	nIdle  int                    // entries on the idle list
	total  int                    // open connections, each counted once
	now    func() time.Time
}

// Bounds on the idle topics a tracker keeps.
const (
	trackerIdleTTL = time.Hour // an idle topic is dropped after this long
	trackerMaxIdle = 10_000    // beyond this many idle topics the oldest go
)

// TopicStats describes one topic's SSE connections.
type TopicStats struct {
	Topic         string    `json:"topic"`         // "" for global connections
	ActiveClients int       `json:"activeClients"` // connections open now
	LastActiveAt  time.Time `json:"lastActiveAt"`  // when a connection last opened or closed
}

// topicEntry is a topic's stats and, while it has no clients, its place on
// the idle list. Entries join the list's back as they become idle, so the
// list is ordered by LastActiveAt.
type topicEntry struct {
	TopicStats
	prev, next *topicEntry // nil while the topic has clients
}

func newTopicClientTracker() *TopicClientTracker {
	t := &TopicClientTracker{topics: make(map[string]*topicEntry), now: time.Now}
	t.idle.prev, t.idle.next = &t.idle, &t.idle
	return t
}

// opened and closed count a connection on topics (none: global).
func (t *TopicClientTracker) opened(topics []string) { t.add(topics, 1) }
func (t *TopicClientTracker) closed(topics []string) { t.add(topics, -1) }

func (t *TopicClientTracker) add(topics []string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now() // under mu, so the idle list is in LastActiveAt order
	t.total += n
	if len(topics) == 0 {
		topics = []string{""}
	}
	for _, topic := range topics {
		e := t.topics[topic]
		if e == nil {
			e = &topicEntry{TopicStats: TopicStats{Topic: topic}}
			t.topics[topic] = e
		}
		if e.next != nil {
			t.unlinkIdle(e)
		}
		e.ActiveClients += n
		e.LastActiveAt = now
		if e.ActiveClients == 0 {
			t.linkIdle(e)
		}
	}
	t.trim(now)
}

func (t *TopicClientTracker) linkIdle(e *topicEntry) {
	e.prev, e.next = t.idle.prev, &t.idle
	e.prev.next, t.idle.prev = e, e
	t.nIdle++
}

func (t *TopicClientTracker) unlinkIdle(e *topicEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	t.nIdle--
}

// trim drops idle topics past either bound, oldest first. t.mu must be held.
func (t *TopicClientTracker) trim(now time.Time) {
	for t.nIdle > 0 {
		e := t.idle.next
		if t.nIdle <= trackerMaxIdle && now.Sub(e.LastActiveAt) <= trackerIdleTTL {
			return
		}
		t.unlinkIdle(e)
		delete(t.topics, e.Topic)
	}
}

// ActiveClients returns how many connections are open on topic.
func (t *TopicClientTracker) ActiveClients(topic string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.topics[topic]; e != nil {
		return e.ActiveClients
	}
	return 0
}

// Total returns how many connections are open, each counted once.
func (t *TopicClientTracker) Total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// Snapshot returns, sorted by topic, every topic with a connection open
// and the topics that have had one recently: a topic stays, with 0
// clients, after its last client leaves, until it has been idle for more
// than an hour or is not among the newest 10,000 idle topics.
func (t *TopicClientTracker) Snapshot() []TopicStats {
	t.mu.Lock()
	t.trim(t.now())
	out := make([]TopicStats, 0, len(t.topics))
	for _, e := range t.topics {
		out = append(out, e.TopicStats)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b TopicStats) int { return strings.Compare(a.Topic, b.Topic) })
	return out
}
