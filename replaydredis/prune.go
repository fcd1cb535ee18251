package replaydredis

// Prune and PruneTopic, in batches of one script each (the package doc,
// "Prune").

import (
	"context"
	"fmt"
	"strconv"

	"github.com/replayd/replayd/storage"
)

// pruneBatch is the most events one prune script deletes: Redis runs
// nothing else while it runs.
const pruneBatch = 1000

// pruneScript, the whole log's prefix (a policy without Topics): ARGV[2]
// MaxEvents (0: none), ARGV[3] MaxAge in microseconds (0: none), ARGV[4]
// the highest sequence it may delete (the head when the prune began),
// ARGV[5] the batch size. It deletes the oldest events the policy
// condemns, at most a batch, raising the watermarks, and returns how many
// it deleted. It reads the stream 16 entries at a time, so that large
// payloads do not pile up in the script's memory.
var pruneScript = newScript(`
local maxEvents, maxAge, through, size = num(ARGV[2]), num(ARGV[3]), num(ARGV[4]), tonumber(ARGV[5])
local d = 0
if maxEvents > 0 then d = math.min(math.max(0, redis.call('ZCARD', P .. 'all') - maxEvents), size) end
if d == 0 and maxAge <= 0 then return 0 end
local cut = 0
if maxAge > 0 then cut = clock() - maxAge end
local n, from = 0, '-'
while n < size do
	local r = redis.call('XRANGE', P .. 'log', from, str(through) .. '-0', 'COUNT', 16)
	if #r == 0 then break end
	for _, e in ipairs(r) do
		if n >= size or (n >= d and num(e[2][10]) >= cut) then return n end
		del(e)
		n = n + 1
		from = '(' .. e[1]
	end
end
return n
`)

// topicPruneScript, one topic's prefix: ARGV[2] the topic, ARGV[3]
// MaxEvents (0: none), ARGV[4] MaxAge in microseconds (0: none), ARGV[5]
// 1 to delete every event through ARGV[6] (PruneTopic), ARGV[6] the
// highest sequence it may delete, ARGV[7] the batch size.
var topicPruneScript = newScript(`
local topic, maxEvents, maxAge, all, through, size = ARGV[2], num(ARGV[3]), num(ARGV[4]), ARGV[5] == '1', num(ARGV[6]), tonumber(ARGV[7])
local k = tkey(topic)
local d = 0
if maxEvents > 0 then d = math.max(0, redis.call('ZCARD', k) - maxEvents) end
local cut = 0
if maxAge > 0 then cut = clock() - maxAge end
local n = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', k, '-inf', str(through), 'LIMIT', 0, size)) do
	local e = entry(tonumber(m))
	if not e then return redis.error_reply('replaydredis: sequence ' .. m .. ' is indexed but not in the stream') end
	if not all and n >= d and num(e[2][10]) >= cut then break end
	del(e)
	n = n + 1
end
return n
`)

// restPruneScript, the default of a policy with Topics over the
// broadcasts and the topics no entry governs, ARGV[6..] (their names; ""
// for the broadcasts): ARGV[2] MaxEvents, counted over all of them
// together (0: none), ARGV[3] MaxAge in microseconds (0: none), ARGV[4]
// the highest sequence it may delete, ARGV[5] the batch size. The count
// deletes the oldest of their union (merged a sequence at a time), the
// age each one's prefix older than the cut.
var restPruneScript = newScript(`
local maxEvents, maxAge, through, size = num(ARGV[2]), num(ARGV[3]), num(ARGV[4]), tonumber(ARGV[5])
local keys = {}
for i = 6, #ARGV do keys[#keys + 1] = tkey(ARGV[i]) end
local n = 0
if maxEvents > 0 then
	local total = 0
	for _, k in ipairs(keys) do total = total + redis.call('ZCARD', k) end
	local d = math.min(math.max(0, total - maxEvents), size)
	while n < d do
		local best
		for _, k in ipairs(keys) do
			local r = redis.call('ZRANGEBYSCORE', k, '-inf', str(through), 'LIMIT', 0, 1)
			if #r == 1 and (not best or tonumber(r[1]) < best) then best = tonumber(r[1]) end
		end
		if not best then break end
		local e = entry(best)
		if not e then return redis.error_reply('replaydredis: sequence ' .. str(best) .. ' is indexed but not in the stream') end
		del(e)
		n = n + 1
	end
end
if maxAge > 0 then
	local cut = clock() - maxAge
	for _, k in ipairs(keys) do
		if n >= size then break end
		for _, m in ipairs(redis.call('ZRANGEBYSCORE', k, '-inf', str(through), 'LIMIT', 0, size - n)) do
			local e = entry(tonumber(m))
			if not e then return redis.error_reply('replaydredis: sequence ' .. m .. ' is indexed but not in the stream') end
			if num(e[2][10]) >= cut then break end
			del(e)
			n = n + 1
		end
	end
end
return n
`)

// Prune deletes the events policy condemns (see storage.Store), in
// batches of at most pruneBatch, each atomic with its watermarks. Only
// events at or below the head it read first are condemned. With Topics,
// each topic an entry governs is pruned by it, then the broadcasts and the
// other topics by the default; the topics come from {P}:topics, the set of
// topics with retained events.
func (s *Store) Prune(ctx context.Context, policy storage.RetentionPolicy) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if err := policy.Validate(); err != nil {
		return 0, err
	}
	if policy.IsZero() {
		return 0, nil
	}
	through, err := s.Head(ctx)
	if err != nil {
		return 0, err
	}
	age := func(d interface{ Microseconds() int64 }) string { return i64(max(d.Microseconds(), 0)) }
	if len(policy.Topics) == 0 {
		return s.batches(ctx, func() (int64, error) {
			return pruneScript.Run(ctx, s.c, nil, s.p, i64(max(policy.MaxEvents, 0)), age(policy.MaxAge),
				i64(through), strconv.Itoa(pruneBatch)).Int64()
		})
	}
	names, err := s.c.SMembers(ctx, s.p+"topics").Result()
	if err != nil {
		return 0, fmt.Errorf("replaydredis: prune: %w", err)
	}
	var total int64
	rest := []any{s.p, i64(max(policy.MaxEvents, 0)), age(policy.MaxAge), i64(through), strconv.Itoa(pruneBatch), ""}
	for _, topic := range names {
		tp, ok := policy.For(topic)
		if !ok {
			rest = append(rest, topic)
			continue
		}
		if tp.MaxEvents <= 0 && tp.MaxAge <= 0 {
			continue // kept for ever
		}
		n, err := s.batches(ctx, func() (int64, error) {
			return topicPruneScript.Run(ctx, s.c, nil, s.p, topic, i64(tp.MaxEvents), age(tp.MaxAge), "0",
				i64(through), strconv.Itoa(pruneBatch)).Int64()
		})
		total += n
		if err != nil {
			return total, err
		}
	}
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return total, nil
	}
	n, err := s.batches(ctx, func() (int64, error) { return restPruneScript.Run(ctx, s.c, nil, rest...).Int64() })
	return total + n, err
}

// PruneTopic deletes the events of topic at or below through (see
// storage.TopicPruner), in batches of at most pruneBatch.
func (s *Store) PruneTopic(ctx context.Context, topic string, through int64) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if topic == "" {
		return 0, fmt.Errorf("replaydredis: %w: PruneTopic of the broadcasts", storage.ErrInvalid)
	}
	head, err := s.Head(ctx)
	if err != nil {
		return 0, err
	}
	through = min(through, head)
	return s.batches(ctx, func() (int64, error) {
		return topicPruneScript.Run(ctx, s.c, nil, s.p, topic, "0", "0", "1", seqArg(through), strconv.Itoa(pruneBatch)).Int64()
	})
}

// batches runs batch until it deletes fewer than pruneBatch, and returns
// the total.
func (s *Store) batches(ctx context.Context, batch func() (int64, error)) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := batch()
		if err != nil {
			return total, fmt.Errorf("replaydredis: prune: %w", err)
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}

var _ storage.TopicPruner = (*Store)(nil)
