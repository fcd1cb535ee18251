package replayd

import (
	"sort"
	"sync"
	"time"
)

// TopicClientTracker counts a hub's active SSE connections per topic, with
// global connections under "", and remembers when each topic last had a
// connection open or close. It is safe for concurrent use.
type TopicClientTracker struct {
	mu     sync.Mutex
	topics map[string]*TopicStats // every topic seen since the hub was created
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

func (t *TopicClientTracker) opened(topic string) { t.add(topic, 1) }
func (t *TopicClientTracker) closed(topic string) { t.add(topic, -1) }

func (t *TopicClientTracker) add(topic string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.topics[topic]
	if ts == nil {
		ts = &TopicStats{Topic: topic}
		t.topics[topic] = ts
	}
	ts.ActiveClients += n
	ts.LastActiveAt = time.Now()
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

// Total returns how many connections are open on all topics.
func (t *TopicClientTracker) Total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, ts := range t.topics {
		n += ts.ActiveClients
	}
	return n
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
