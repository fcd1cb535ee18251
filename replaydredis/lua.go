package replaydredis

// The Lua shared by the store's scripts (see the package doc, "One script
// per operation"): every script is luaPrelude followed by its own body,
// and gets the key prefix "{P}:" as ARGV[1].
//
// Numbers cross into Redis commands as strings made by str: Redis's
// conversion of a Lua number would print a sequence in exponent form.

import "github.com/redis/go-redis/v9"

const luaPrelude = `
local P = ARGV[1]
local function num(x) return tonumber(x) or 0 end
local function str(x) return string.format('%d', x) end
local function clock()
	local t = redis.call('TIME')
	return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function tkey(topic)
	if topic == '' then return P .. 'b' end
	return P .. 't:' .. topic
end
local function seqOf(id) return tonumber(string.match(id, '^(%d+)')) end

-- highest: the highest sequence the keys tell was issued or skipped (the
-- head, the stream's last id, the watermarks, the skipped ranges).
local function highest()
	local h = num(redis.call('GET', P .. 'head'))
	if redis.call('EXISTS', P .. 'log') == 1 then
		local info = redis.call('XINFO', 'STREAM', P .. 'log')
		for i = 1, #info, 2 do
			if info[i] == 'last-generated-id' then h = math.max(h, seqOf(info[i + 1])) end
		end
	end
	h = math.max(h, num(redis.call('HGET', P .. 'marks', '*')))
	local top = redis.call('ZREVRANGE', P .. 'skips', 0, 0, 'WITHSCORES')
	if #top == 2 then h = math.max(h, num(top[2])) end
	return h
end

-- raise sets the head to "to", recording the range (old, to) skipped.
local function raise(old, to)
	if to > old then
		redis.call('ZADD', P .. 'skips', 'GT', str(to), str(old))
	end
	redis.call('SET', P .. 'head', str(to))
end

-- foreign reports whether cursor c is foreign: above the head, or strictly
-- inside a skipped range that ends at or below the head.
local function foreign(c, head)
	if c > head then return true end
	if c <= 0 then return false end
	local r = redis.call('ZRANGEBYSCORE', P .. 'skips', '(' .. str(c), '+inf', 'WITHSCORES', 'LIMIT', 0, 16)
	for i = 1, #r, 2 do
		if num(r[i]) < c and num(r[i + 1]) <= head then return true end
	end
	return false
end

-- scope reads the scope at ARGV[i] (a count, then the topics): the sorted
-- sets of its events, its watermark, and the index after it.
local function scope(i)
	local n = tonumber(ARGV[i])
	if n == 0 then
		return {P .. 'all'}, num(redis.call('HGET', P .. 'marks', '*')), i + 1
	end
	local keys, fields = {P .. 'b'}, {'b'}
	for j = 1, n do
		keys[j + 1] = P .. 't:' .. ARGV[i + j]
		fields[j + 1] = 't:' .. ARGV[i + j]
	end
	local w = 0
	for _, m in ipairs(redis.call('HMGET', P .. 'marks', unpack(fields))) do w = math.max(w, num(m)) end
	return keys, w, i + n + 1
end

-- guard returns the head appends go above: a head that is missing (the
-- keys were deleted or flushed) or below issued, what the store knows its
-- log issued (the log was replaced under it), is first raised to the
-- clock now, or above issued if the clock is behind, so that no sequence
-- is issued twice.
local function guard(issued, now)
	local hv = redis.call('GET', P .. 'head')
	local head = num(hv)
	if not hv or head < issued then
		local old = head
		if not hv then old = highest() end
		head = math.max(now, issued + 1, old)
		raise(old, head)
	end
	return head
end

-- put writes the event of sequence seq (a string) to the stream and its
-- indexes; the caller sets the head and {P}:at.
local function put(seq, id, typ, topic, payload, at)
	redis.call('XADD', P .. 'log', seq .. '-0', 'i', id, 'y', typ, 't', topic, 'p', payload, 'c', at)
	redis.call('ZADD', P .. 'all', seq, seq)
	redis.call('ZADD', tkey(topic), seq, seq)
	redis.call('HSET', P .. 'ids', id, seq)
	if topic ~= '' then redis.call('SADD', P .. 'topics', topic) end
end

-- entry returns the stream entry {id, fields} of sequence seq, or nil.
local function entry(seq)
	local id = str(seq) .. '-0'
	return redis.call('XRANGE', P .. 'log', id, id)[1]
end

-- del deletes the event of stream entry e from the stream and its indexes,
-- raising its topic's watermark and the global one.
local function del(e)
	local seq, f = seqOf(e[1]), e[2]
	local id, topic, s = f[2], f[6], str(seqOf(e[1]))
	local k = tkey(topic)
	redis.call('XDEL', P .. 'log', e[1])
	redis.call('ZREM', P .. 'all', s)
	redis.call('ZREM', k, s)
	if topic ~= '' and redis.call('ZCARD', k) == 0 then redis.call('SREM', P .. 'topics', topic) end
	if redis.call('HGET', P .. 'ids', id) == s then redis.call('HDEL', P .. 'ids', id) end
	local field = 'b'
	if topic ~= '' then field = 't:' .. topic end
	for _, fl in ipairs({field, '*'}) do
		if seq > num(redis.call('HGET', P .. 'marks', fl)) then redis.call('HSET', P .. 'marks', fl, s) end
	end
end

-- load returns the event of sequence seq as {seq, id, type, topic,
-- payload, created}, or nil if it is not in the stream.
local function load(seq)
	local id = str(seq) .. '-0'
	local r = redis.call('XRANGE', P .. 'log', id, id)
	if #r == 0 then return nil end
	local f = r[1][2]
	return {seq, f[2], f[4], f[6], f[8], num(f[10])}
end
`

// newScript makes a script of luaPrelude and body.
func newScript(body string) *redis.Script { return redis.NewScript(luaPrelude + body) }

// newScriptRaw makes a script of src alone.
func newScriptRaw(src string) *redis.Script { return redis.NewScript(src) }
