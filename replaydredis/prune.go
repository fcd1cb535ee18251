package replaydredis

// Prune, in batches of one script each (the package doc, "Prune").

import (
	"context"
	"fmt"
	"strconv"

	"github.com/replayd/replayd/storage"
)

// pruneBatch is the most events one prune script deletes: Redis runs
// nothing else while it runs.
const pruneBatch = 1000

// pruneScript: ARGV[2] MaxEvents (0: none), ARGV[3] MaxAge in
// microseconds (0: none), ARGV[4] the batch size. It deletes the oldest
// events the policy condemns, at most a batch, raising the watermarks,
// and returns how many it deleted. It reads the stream 16 entries at a
// time, so that large payloads do not pile up in the script's memory.
var pruneScript = newScript(`
local maxEvents, maxAge, size = num(ARGV[2]), num(ARGV[3]), tonumber(ARGV[4])
local d = 0
if maxEvents > 0 then d = math.min(math.max(0, redis.call('ZCARD', P .. 'all') - maxEvents), size) end
if d == 0 and maxAge <= 0 then return 0 end
local cut = 0
if maxAge > 0 then cut = clock() - maxAge end
local marks, all, n, from = {}, 0, 0, '-'
-- The oldest entries, a few at a time (payloads may be large): each is
-- deleted while the count condemns it or it is older than the cut.
while n < size do
	local r = redis.call('XRANGE', P .. 'log', from, '+', 'COUNT', 16)
	if #r == 0 then break end
	local stop = false
	for _, e in ipairs(r) do
		local f = e[2]
		if n >= size or (n >= d and num(f[10]) >= cut) then
			stop = true
			break
		end
		local seq = seqOf(e[1])
		local id, topic, s = f[2], f[6], str(seq)
		redis.call('XDEL', P .. 'log', e[1])
		redis.call('ZREM', P .. 'all', s)
		redis.call('ZREM', tkey(topic), s)
		if redis.call('HGET', P .. 'ids', id) == s then redis.call('HDEL', P .. 'ids', id) end
		local field = 'b'
		if topic ~= '' then field = 't:' .. topic end
		marks[field] = math.max(marks[field] or 0, seq)
		all = math.max(all, seq)
		n = n + 1
		from = '(' .. e[1]
	end
	if stop then break end
end
if n > 0 then
	marks['*'] = all
	for field, m in pairs(marks) do
		if m > num(redis.call('HGET', P .. 'marks', field)) then redis.call('HSET', P .. 'marks', field, str(m)) end
	end
end
return n
`)

// Prune deletes the events policy condemns (see storage.Store), in
// batches of at most pruneBatch, each atomic with its watermarks.
func (s *Store) Prune(ctx context.Context, policy storage.RetentionPolicy) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if policy.MaxEvents <= 0 && policy.MaxAge <= 0 {
		return 0, nil
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := pruneScript.Run(ctx, s.c, nil, s.p, i64(max(policy.MaxEvents, 0)),
			i64(max(policy.MaxAge.Microseconds(), 0)), strconv.Itoa(pruneBatch)).Int64()
		if err != nil {
			return total, fmt.Errorf("replaydredis: prune: %w", err)
		}
		total += n
		if n < pruneBatch {
			return total, nil
		}
	}
}
