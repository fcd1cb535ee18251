package replayd

import (
	"sort"
	"sync"
	"time"
)

// TopicClientTracker counts a hub's active SSE connections per topic, with
// global connections under "", and remembers when each topic last had a
// connection open or close. A connection on several topics counts under
// each of them, and once in Total. It is safe for concurrent use.
type TopicClientTracker struct {
	mu     sync.Mutex
	topics map[string]*TopicStats // every topic seen since the hub was created
	total  int                    // open connections, each counted once
}

// TopicStats describes one topic's SSE connections.
type TopicStats struct {
	Topic         string    `json:"topic"`         // "" for global connections
	ActiveClients int       `json:"activeClients"` // connections open now
	LastActiveAt  time.Time `json:"lastActiveAt"`  // when a connection last opened or closed
}

func newTopicClientTracker() *TopicClientTracker {
	return &TopicClientTracker{topics: make(map[string]*TopicStats)}
}

// opened and closed count a connection on topics (none: global).
func (t *TopicClientTracker) opened(topics []string) { t.add(topics, 1) }
func (t *TopicClientTracker) closed(topics []string) { t.add(topics, -1) }

func (t *TopicClientTracker) add(topics []string, n int) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += n
	if len(topics) == 0 {
		topics = []string{""}
	}
	for _, topic := range topics {
		ts := t.topics[topic]
		if ts == nil {
			ts = &TopicStats{Topic: topic}
			t.topics[topic] = ts
		}
		ts.ActiveClients += n
		ts.LastActiveAt = now
	}
}

// ActiveClients returns how many connections are open on topic.
func (t *TopicClientTracker) ActiveClients(topic string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ts := t.topics[topic]; ts != nil {
		return ts.ActiveClients
	}
	return 0
}

// Total returns how many connections are open, each counted once.
func (t *TopicClientTracker) Total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// Snapshot returns every topic seen since the hub was created, sorted by
// topic. A topic stays, with 0 clients, after its last client leaves.
func (t *TopicClientTracker) Snapshot() []TopicStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]TopicStats, 0, len(t.topics))
	for _, ts := range t.topics {
		out = append(out, *ts)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	return out
}
