package storage

import "context"

// StreamStore is an optional [Store] capability: a store that keeps the
// state of Durable Streams (a stream's metadata, its idempotent
// producers) in the same transactions as the log's appends, so that a
// stream's state and its events commit together or not at all.
// replayd.EventHub.DurableStreams needs it; over a store without it, that
// handler answers 501.
//
// The store keeps the state opaque: a stream's record and a producer's
// state are bytes the hub writes and reads back, keyed by topic (and
// producer id). All the protocol's rules live once, in the hub; a store
// only has to make UpdateStreams atomic and serialised per topic, and
// ReadStream one snapshot.
type StreamStore interface {
	// UpdateStreams runs fn in one write transaction and commits it if fn
	// returns nil, else rolls it back and returns fn's error: the records,
	// producer states and events fn wrote through tx are stored together or
	// not at all. No other UpdateStreams naming one of topics (in any
	// process, on any node) runs its fn beside it, so a read through tx of
	// a record of topics stays true until the commit. fn may be called
	// again after a serialisation failure; it must not keep effects of a
	// call outside tx. Events appended through tx follow the log's rules
	// (sequence order is visibility order; event ids are idempotency keys).
	UpdateStreams(ctx context.Context, topics []string, fn func(tx StreamTx) error) error

	// ReadStream reads, in one snapshot, what a Durable Streams read of
	// req.Topic needs: the stream's record; the topic's own events (never
	// broadcasts) with a sequence in (req.After, req.Through] (Through 0:
	// no bound), ascending, cut as Read cuts a page (Limit, MaxBytes, at
	// least one); and what tells whether req.After is a position of the
	// topic (At, Watermark, Head, Foreign), and the topic's newest event
	// (Last).
	ReadStream(ctx context.Context, req StreamReadRequest) (StreamPage, error)

	// DueStreams returns the records whose ExpiresAt is due by now (Unix
	// milliseconds): above 0 and at or below now, the earliest first (then
	// by topic), at most limit (<= 0: 100). It is how the hub's sweep of
	// Durable Streams finds the streams that expired and the log that
	// deleted ones left to reclaim; a store should index ExpiresAt so that
	// its cost follows what it returns, not how many streams there are. It
	// reads one snapshot, outside any stream transaction: the sweep checks
	// each record again in one.
	DueStreams(ctx context.Context, now int64, limit int) ([]StreamRecord, error)
}

// StreamTx is a transaction of [StreamStore.UpdateStreams]. Its writes
// are only to the topics the transaction was opened for.
type StreamTx interface {
	// Stream returns the record of topic, and whether there is one.
	Stream(ctx context.Context, topic string) (StreamRecord, bool, error)
	// PutStream stores rec, replacing the record of its topic.
	PutStream(ctx context.Context, rec StreamRecord) error
	// DeleteStream removes the record of topic and every producer state of
	// it. The topic's events stay in the log (the hub prunes them itself,
	// through a [TopicPruner]).
	DeleteStream(ctx context.Context, topic string) error
	// Producer returns the state stored for a producer of topic, and
	// whether there is one.
	Producer(ctx context.Context, topic, producer string) ([]byte, bool, error)
	// PutProducer stores the state of a producer of topic.
	PutProducer(ctx context.Context, topic, producer string, state []byte) error
	// Last returns the sequence of the newest event of topic; 0: none.
	Last(ctx context.Context, topic string) (int64, error)
	// Append appends evs in the transaction, as [Store.Append] does
	// (sequences, CreatedAt, duplicates by event id), visible once it
	// commits.
	Append(ctx context.Context, evs []Event) ([]AppendResult, error)
}

// StreamsReader is an optional [StreamTx] capability: reading the records
// of many topics in one statement. A caller that reads a record of every
// one of many topics (the job committer: one per running job, each
// commit) uses it when the transaction has it, and falls back to one
// Stream call per topic when it has not; a store implements it when a
// round trip or a statement per record costs more than one for all.
type StreamsReader interface {
	// Streams returns the records of those of topics that have one, in no
	// particular order; a topic named twice is returned once.
	Streams(ctx context.Context, topics []string) ([]StreamRecord, error)
}

// StreamRecord is the stored state of one Durable Stream: one per topic.
type StreamRecord struct {
	Topic string
	// Meta is the hub's encoding of the stream's metadata; the store keeps
	// it as it is.
	Meta []byte
	// ExpiresAt is when the hub must look at the record again, in Unix
	// milliseconds (0: never): when the stream expires, or at once (1) when
	// the hub has its log to reclaim. [StreamStore.DueStreams] lists the
	// records by it.
	ExpiresAt int64
}

// StreamReadRequest selects what [StreamStore.ReadStream] returns.
type StreamReadRequest struct {
	Topic    string
	After    int64 // only events with a sequence above this
	Through  int64 // and at or below this; 0: no upper bound
	Limit    int   // at most this many events; <= 0: 100
	MaxBytes int   // no more events once they hold this many payload bytes (at least one); <= 0: no bound
}

// StreamPage is [StreamStore.ReadStream]'s answer, read in one snapshot.
type StreamPage struct {
	Record StreamRecord // the topic's record, when Found
	Found  bool
	Events []Event // the topic's events in (After, Through], ascending
	More   bool    // more such events exist after the last returned
	// At reports that an event of the topic with sequence After is
	// retained in the log.
	At bool
	// Last is the sequence of the topic's newest retained event; 0: none.
	Last int64
	// Watermark is the topic's own prune watermark (not the broadcasts').
	Watermark int64
	Head      int64
	Foreign   bool // After is foreign: above Head, or inside a skipped range (see the sequence floor)
}
