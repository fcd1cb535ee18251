package replaydredis

// Durable Streams' state (storage.StreamStore): optimistic transactions.
//
// A stream transaction reads through plain commands and keeps its writes
// (records, producer states, events) in memory; its commit is one script
// that checks nothing it depended on moved, then writes it all, or writes
// nothing and makes UpdateStreams run fn again. What it depends on: each
// of its topics' version ({P}:sv:<T>, raised by every commit naming the
// topic), and, once it appended or read a topic's newest event, the head
// (every append moves it). Its events' sequences, created_at and
// duplicates are decided when fn appends them, from the head and {P}:at
// read then: with the head unchanged at the commit, they are what the
// commit's own append would decide, so fn gets them at once, and sequence
// order stays visibility order (the commit writes them in one script).
//
// A record is the hash {P}:s:<T> (m: the metadata, x: the expiry), a
// topic's producers the hash {P}:p:<T> (producer id -> state); the sorted
// set {P}:due indexes the records with an expiry (score the expiry, member
// the topic), for DueStreams. The cost of
// optimism: a transaction that appends retries while other appends land
// between its first append and its commit; UpdateStreams gives up after
// maxStreamAttempts.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/replayd/replayd/storage"
)

var _ storage.StreamStore = (*Store)(nil)

// maxStreamAttempts bounds the runs of fn of one UpdateStreams.
const maxStreamAttempts = 64

// errStreamConflict is UpdateStreams' error when every attempt found what
// it read moved.
var errStreamConflict = errors.New("replaydredis: stream transaction: what it read kept changing")

// txBeginScript, ARGV[2] the highest sequence the store knows was issued:
// the head (after its guard), {P}:at, and the versions of the topics
// ARGV[3..]. The appends of a transaction go above that head.
var txBeginScript = newScript(`
local now = clock()
local head = guard(num(ARGV[2]), now)
local out = {head, math.max(now, num(redis.call('GET', P .. 'at')))}
for i = 3, #ARGV do out[#out + 1] = num(redis.call('GET', P .. 'sv:' .. ARGV[i])) end
return out
`)

// txCommitScript: ARGV[2] the head the transaction's appends went above
// (-1: it did not depend on the head), ARGV[3] created_at, ARGV[4] n, the
// topics and their versions (2n arguments), then the writes, each an
// opcode and its arguments: 'S' topic meta expiry, 'D' topic, 'P' topic
// producer state, 'E' sequence id type topic payload. It returns 1, or 0
// if what the transaction read moved (nothing written).
var txCommitScript = newScript(`
local want, at, n = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
for i = 0, n - 1 do
	if num(redis.call('GET', P .. 'sv:' .. ARGV[5 + 2 * i])) ~= tonumber(ARGV[6 + 2 * i]) then return 0 end
end
if want >= 0 and num(redis.call('GET', P .. 'head')) ~= want then return 0 end
local i, last = 5 + 2 * n, 0
while i <= #ARGV do
	local op = ARGV[i]
	if op == 'S' then
		redis.call('DEL', P .. 's:' .. ARGV[i + 1])
		redis.call('HSET', P .. 's:' .. ARGV[i + 1], 'm', ARGV[i + 2], 'x', ARGV[i + 3])
		if tonumber(ARGV[i + 3]) > 0 then
			redis.call('ZADD', P .. 'due', ARGV[i + 3], ARGV[i + 1])
		else
			redis.call('ZREM', P .. 'due', ARGV[i + 1])
		end
		i = i + 4
	elseif op == 'D' then
		redis.call('DEL', P .. 's:' .. ARGV[i + 1], P .. 'p:' .. ARGV[i + 1])
		redis.call('ZREM', P .. 'due', ARGV[i + 1])
		i = i + 2
	elseif op == 'P' then
		redis.call('HSET', P .. 'p:' .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
		i = i + 4
	else
		put(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], at)
		last = tonumber(ARGV[i + 1])
		i = i + 6
	end
end
if last > 0 then
	redis.call('SET', P .. 'head', str(last))
	redis.call('SET', P .. 'at', at)
end
for j = 0, n - 1 do redis.call('INCR', P .. 'sv:' .. ARGV[5 + 2 * j]) end
return 1
`)

// UpdateStreams runs fn in an optimistic transaction (see the file's
// doc), again if what it read moved before its commit.
func (s *Store) UpdateStreams(ctx context.Context, topics []string, fn func(tx storage.StreamTx) error) error {
	topics = slices.Clone(topics)
	slices.Sort(topics)
	topics = slices.Compact(topics)
	for attempt := range maxStreamAttempts {
		if s.isClosed() {
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		args := []any{s.p, i64(s.issued.Load())}
		for _, t := range topics {
			args = append(args, t)
		}
		v, err := txBeginScript.Run(ctx, s.c, nil, args...).Int64Slice()
		if err != nil {
			return fmt.Errorf("replaydredis: stream transaction: %w", err)
		}
		tx := &streamTx{s: s, topics: topics, head: v[0], at: v[1], versions: v[2:],
			records: map[string]*storage.StreamRecord{}, deleted: map[string]bool{},
			producers: map[[2]string][]byte{}, ids: map[string]storage.Event{}, last: map[string]int64{}}
		tx.next = tx.head
		if err := fn(tx); err != nil {
			return err
		}
		ok, err := tx.commit(ctx)
		if err != nil {
			return err
		}
		if ok {
			s.saw(tx.next)
			return nil
		}
		// Others committed meanwhile: back off a little, at random, so
		// that the transactions contending for a topic spread out.
		d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 5)))
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
	return errStreamConflict
}

// streamTx is one attempt of an UpdateStreams.
type streamTx struct {
	s        *Store
	topics   []string
	head, at int64   // the head and created_at read at the start
	versions []int64 // the topics' versions read at the start
	next     int64   // the last sequence the transaction assigned (head: none)
	onHead   bool    // the commit depends on the head not moving

	records   map[string]*storage.StreamRecord // written: nil for deleted
	deleted   map[string]bool                  // topics deleted (with their producers) in the transaction
	producers map[[2]string][]byte             // written
	ids       map[string]storage.Event         // events appended, by id
	last      map[string]int64                 // the newest event appended, by topic
	writes    []any                            // the commit's writes
}

func (tx *streamTx) mine(topic string) error {
	if !slices.Contains(tx.topics, topic) {
		return fmt.Errorf("replaydredis: %w: topic %q is not one of the transaction's %v", storage.ErrInvalid, topic, tx.topics)
	}
	return nil
}

func (tx *streamTx) Stream(ctx context.Context, topic string) (storage.StreamRecord, bool, error) {
	if rec, ok := tx.records[topic]; ok {
		if rec == nil {
			return storage.StreamRecord{}, false, nil
		}
		return *rec, true, nil
	}
	m, err := tx.s.c.HGetAll(ctx, tx.s.p+"s:"+topic).Result()
	if err != nil {
		return storage.StreamRecord{}, false, fmt.Errorf("replaydredis: stream record: %w", err)
	}
	return recordOf(topic, m)
}

// recordOf decodes the hash of a record.
func recordOf(topic string, m map[string]string) (storage.StreamRecord, bool, error) {
	meta, ok := m["m"]
	if !ok {
		return storage.StreamRecord{}, false, nil
	}
	x, err := strconv.ParseInt(m["x"], 10, 64)
	if err != nil {
		return storage.StreamRecord{}, false, fmt.Errorf("replaydredis: stream record of %q: expiry %q", topic, m["x"])
	}
	return storage.StreamRecord{Topic: topic, Meta: []byte(meta), ExpiresAt: x}, true, nil
}

func (tx *streamTx) PutStream(ctx context.Context, rec storage.StreamRecord) error {
	if err := tx.mine(rec.Topic); err != nil {
		return err
	}
	r := rec
	r.Meta = slices.Clone(rec.Meta)
	tx.records[rec.Topic] = &r
	tx.writes = append(tx.writes, "S", rec.Topic, []byte(r.Meta), i64(rec.ExpiresAt))
	return nil
}

func (tx *streamTx) DeleteStream(ctx context.Context, topic string) error {
	if err := tx.mine(topic); err != nil {
		return err
	}
	tx.records[topic] = nil
	tx.deleted[topic] = true
	for k := range tx.producers {
		if k[0] == topic {
			delete(tx.producers, k)
		}
	}
	tx.writes = append(tx.writes, "D", topic)
	return nil
}

func (tx *streamTx) Producer(ctx context.Context, topic, producer string) ([]byte, bool, error) {
	if st, ok := tx.producers[[2]string{topic, producer}]; ok {
		return slices.Clone(st), true, nil
	}
	if tx.deleted[topic] {
		return nil, false, nil
	}
	st, err := tx.s.c.HGet(ctx, tx.s.p+"p:"+topic, producer).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("replaydredis: producer state: %w", err)
	}
	return st, true, nil
}

func (tx *streamTx) PutProducer(ctx context.Context, topic, producer string, state []byte) error {
	if err := tx.mine(topic); err != nil {
		return err
	}
	tx.producers[[2]string{topic, producer}] = slices.Clone(state)
	tx.writes = append(tx.writes, "P", topic, producer, slices.Clone(state))
	return nil
}

// Last reads the topic's newest event as of the start's head: the commit
// then depends on the head.
func (tx *streamTx) Last(ctx context.Context, topic string) (int64, error) {
	if l, ok := tx.last[topic]; ok {
		return l, nil
	}
	tx.onHead = true
	r, err := tx.s.c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: tx.s.p + tkeyGo(topic), Start: i64(tx.head), Stop: "-inf",
		ByScore: true, Rev: true, Count: 1}).Result()
	if err != nil {
		return 0, fmt.Errorf("replaydredis: last event: %w", err)
	}
	if len(r) == 0 {
		return 0, nil
	}
	return strconv.ParseInt(r[0], 10, 64)
}

// tkeyGo is the Lua tkey: a topic's sorted set, without the prefix.
func tkeyGo(topic string) string {
	if topic == "" {
		return "b"
	}
	return "t:" + topic
}

// Append decides the events' sequences, created_at and duplicates now
// (see the file's doc); the commit writes them.
func (tx *streamTx) Append(ctx context.Context, evs []storage.Event) ([]storage.AppendResult, error) {
	tx.onHead = true
	out := make([]storage.AppendResult, len(evs))
	for i, e := range evs {
		if orig, ok := tx.ids[e.EventID]; ok {
			out[i] = storage.AppendResult{Event: orig, Duplicate: true}
			continue
		}
		orig, found, err := tx.s.stored(ctx, e.EventID)
		if err != nil {
			return nil, err
		}
		if found {
			out[i] = storage.AppendResult{Event: orig, Duplicate: true}
			continue
		}
		tx.next++
		e.Sequence, e.CreatedAt = tx.next, time.UnixMicro(tx.at)
		e.Payload = slices.Clone(e.Payload)
		tx.ids[e.EventID] = e
		tx.last[e.Topic] = e.Sequence
		tx.writes = append(tx.writes, "E", i64(e.Sequence), e.EventID, e.Type, e.Topic, []byte(e.Payload))
		out[i] = storage.AppendResult{Event: e}
	}
	return out, nil
}

// loadScript: ARGV[2] an event id: the stored event (see load), or nil.
var loadScript = newScript(`
local s = redis.call('HGET', P .. 'ids', ARGV[2])
if not s then return nil end
return load(tonumber(s))
`)

// stored returns the event stored under id, if any.
func (s *Store) stored(ctx context.Context, id string) (storage.Event, bool, error) {
	v, err := loadScript.Run(ctx, s.c, nil, s.p, id).Slice()
	if errors.Is(err, redis.Nil) {
		return storage.Event{}, false, nil
	}
	if err != nil {
		return storage.Event{}, false, fmt.Errorf("replaydredis: event id: %w", err)
	}
	e, err := eventOf(v)
	return e, err == nil, err
}

// commit runs the commit script: false if what the transaction read moved.
func (tx *streamTx) commit(ctx context.Context) (bool, error) {
	if len(tx.writes) == 0 {
		return true, nil // it read only
	}
	want := int64(-1)
	if tx.onHead {
		want = tx.head
	}
	args := []any{tx.s.p, i64(want), i64(tx.at), strconv.Itoa(len(tx.topics))}
	for i, t := range tx.topics {
		args = append(args, t, i64(tx.versions[i]))
	}
	args = append(args, tx.writes...)
	ok, err := txCommitScript.Run(ctx, tx.s.c, nil, args...).Int64()
	if err != nil {
		return false, fmt.Errorf("replaydredis: stream transaction commit: %w", outcome(err))
	}
	return ok == 1, nil
}

// readStreamScript: ARGV[2] the topic, ARGV[3] after, ARGV[4] through (0:
// none), ARGV[5] limit, ARGV[6] max bytes (0: none). It returns {head,
// watermark, foreign, more, at, last, meta or false, expiry, events}.
var readStreamScript = newScript(`
local topic, after, through, limit, maxb = ARGV[2], num(ARGV[3]), num(ARGV[4]), tonumber(ARGV[5]), num(ARGV[6])
local k = tkey(topic)
local head = num(redis.call('GET', P .. 'head'))
local field = 'b'
if topic ~= '' then field = 't:' .. topic end
local w = num(redis.call('HGET', P .. 'marks', field))
local hi = '+inf'
if through > 0 then hi = str(through) end
local cand = redis.call('ZRANGEBYSCORE', k, '(' .. str(after), hi, 'LIMIT', 0, limit + 1)
local evs, size = {}, 0
for i = 1, math.min(#cand, limit) do
	if maxb > 0 and size >= maxb then break end
	local e = load(tonumber(cand[i]))
	if not e then return redis.error_reply('replaydredis: sequence ' .. cand[i] .. ' is indexed but not in the stream') end
	evs[#evs + 1] = e
	size = size + #e[5]
end
local more, f, at, last = 0, 0, 0, 0
if #cand > #evs then more = 1 end
if foreign(after, head) then f = 1 end
if after > 0 and redis.call('ZSCORE', k, str(after)) then at = 1 end
local top = redis.call('ZREVRANGE', k, 0, 0)
if #top == 1 then last = tonumber(top[1]) end
local rec = redis.call('HMGET', P .. 's:' .. topic, 'm', 'x')
return {head, w, f, more, at, last, rec[1], num(rec[2]), evs}
`)

// ReadStream reads what a Durable Streams read of req.Topic needs, in one
// snapshot (see storage.StreamStore).
func (s *Store) ReadStream(ctx context.Context, req storage.StreamReadRequest) (storage.StreamPage, error) {
	if s.isClosed() {
		return storage.StreamPage{}, ErrClosed
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 100
	}
	v, err := readStreamScript.Run(ctx, s.c, nil, s.p, req.Topic, seqArg(req.After), seqArg(max(req.Through, 0)),
		strconv.Itoa(limit), strconv.Itoa(max(req.MaxBytes, 0))).Slice()
	if err != nil {
		return storage.StreamPage{}, fmt.Errorf("replaydredis: read stream: %w", err)
	}
	if len(v) != 9 {
		return storage.StreamPage{}, fmt.Errorf("replaydredis: read stream: %d fields", len(v))
	}
	p := storage.StreamPage{Head: v[0].(int64), Watermark: v[1].(int64), Foreign: v[2].(int64) == 1,
		More: v[3].(int64) == 1, At: v[4].(int64) == 1, Last: v[5].(int64)}
	if meta, ok := v[6].(string); ok {
		p.Found = true
		p.Record = storage.StreamRecord{Topic: req.Topic, Meta: []byte(meta), ExpiresAt: v[7].(int64)}
	}
	raw, _ := v[8].([]any)
	for _, r := range raw {
		f, _ := r.([]any)
		e, err := eventOf(f)
		if err != nil {
			return storage.StreamPage{}, fmt.Errorf("replaydredis: read stream: %w", err)
		}
		p.Events = append(p.Events, e)
	}
	s.saw(p.Head)
	return p, nil
}

// dueScript: ARGV[2] now (Unix milliseconds), ARGV[3] the limit. It
// returns topic, metadata and expiry of each record due, flat.
var dueScript = newScript(`
local out = {}
for _, topic in ipairs(redis.call('ZRANGEBYSCORE', P .. 'due', '(0', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))) do
	local rec = redis.call('HMGET', P .. 's:' .. topic, 'm', 'x')
	if rec[1] then
		out[#out + 1] = topic
		out[#out + 1] = rec[1]
		out[#out + 1] = num(rec[2])
	end
end
return out
`)

// DueStreams returns the records whose ExpiresAt is due by now, earliest
// first, then by topic (see storage.StreamStore): a range of {P}:due.
func (s *Store) DueStreams(ctx context.Context, now int64, limit int) ([]storage.StreamRecord, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	if limit <= 0 {
		limit = 100
	}
	if now <= 0 {
		return nil, nil
	}
	v, err := dueScript.Run(ctx, s.c, nil, s.p, seqArg(now), strconv.Itoa(limit)).Slice()
	if err != nil {
		return nil, fmt.Errorf("replaydredis: due streams: %w", err)
	}
	var out []storage.StreamRecord
	for i := 0; i+2 < len(v); i += 3 {
		topic, _ := v[i].(string)
		meta, _ := v[i+1].(string)
		x, _ := v[i+2].(int64)
		out = append(out, storage.StreamRecord{Topic: topic, Meta: []byte(meta), ExpiresAt: x})
	}
	return out, nil
}
