package replaydredis

// The reads: Head, Read, Window and Count, each one script, so one
// snapshot (the package doc, "Reading a scope of several topics").

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/replayd/replayd/storage"
)

// readScript: ARGV[2] after, ARGV[3] through (0: no bound), ARGV[4]
// limit, ARGV[5] max bytes (0: no bound), then the scope. It returns
// {head, watermark, foreign, more, events}.
var readScript = newScript(`
local after, through, limit, maxb = num(ARGV[2]), num(ARGV[3]), tonumber(ARGV[4]), num(ARGV[5])
local keys, w = scope(6)
local head = num(redis.call('GET', P .. 'head'))
local hi = '+inf'
if through > 0 then hi = str(through) end
local cand = {}
for _, k in ipairs(keys) do
	for _, m in ipairs(redis.call('ZRANGEBYSCORE', k, '(' .. str(after), hi, 'LIMIT', 0, limit + 1)) do
		cand[#cand + 1] = tonumber(m)
	end
end
table.sort(cand)
local evs, size = {}, 0
for i = 1, math.min(#cand, limit) do
	if maxb > 0 and size >= maxb then break end
	local e = load(cand[i])
	if not e then return redis.error_reply('replaydredis: sequence ' .. str(cand[i]) .. ' is indexed but not in the stream') end
	evs[#evs + 1] = e
	size = size + #e[5]
end
local more, f = 0, 0
if #cand > #evs then more = 1 end
if foreign(after, head) then f = 1 end
return {head, w, f, more, evs}
`)

// windowScript: ARGV[2] the cursor, ARGV[3] the limit, then the scope. It
// returns {head, from, skipped count, first, last, watermark, foreign}.
var windowScript = newScript(`
local cursor, limit = num(ARGV[2]), tonumber(ARGV[3])
local keys, w = scope(4)
local head = num(redis.call('GET', P .. 'head'))
if cursor >= head or foreign(cursor, head) then
	local f = 0
	if foreign(cursor, head) then f = 1 end
	return {head, head + 1, 0, 0, 0, w, f}
end
local above = '(' .. str(cursor)
local total = 0
for _, k in ipairs(keys) do total = total + redis.call('ZCOUNT', k, above, '+inf') end
local nw = math.min(math.max(limit, 0), total)
local desc = {}
if total > 0 then
	for _, k in ipairs(keys) do
		for _, m in ipairs(redis.call('ZREVRANGEBYSCORE', k, '+inf', above, 'LIMIT', 0, nw + 1)) do
			desc[#desc + 1] = tonumber(m)
		end
	end
	table.sort(desc, function(a, b) return a > b end)
end
local from = head + 1
if nw > 0 then from = desc[nw] end
local sk, first, last = total - nw, 0, 0
if sk > 0 then
	last = desc[nw + 1]
	for _, k in ipairs(keys) do
		local r = redis.call('ZRANGEBYSCORE', k, above, '+inf', 'LIMIT', 0, 1)
		if #r == 1 and (first == 0 or tonumber(r[1]) < first) then first = tonumber(r[1]) end
	end
end
return {head, from, sk, first, last, w, 0}
`)

// countScript: ARGV[2] after, ARGV[3] before, then the scope.
var countScript = newScript(`
local lo, hi = '(' .. ARGV[2], '(' .. ARGV[3]
local keys = scope(4)
local n = 0
for _, k in ipairs(keys) do n = n + redis.call('ZCOUNT', k, lo, hi) end
return n
`)

// scopeArgs appends the scope's arguments: the count, then the topics.
func scopeArgs(args []any, scope []string) []any {
	args = append(args, strconv.Itoa(len(scope)))
	for _, t := range scope {
		args = append(args, t)
	}
	return args
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

// maxExact bounds the sequences the scripts are given: Lua's numbers are
// doubles, exact for integers up to 2^53, far above any sequence a log
// issues (see the package doc, "Keys"). A larger cursor (the hub reads the
// head with math.MaxInt64) means the same there: above every sequence.
const maxExact = 1 << 53

// seqArg is a sequence argument of a script, at most maxExact.
func seqArg(n int64) string { return i64(min(n, maxExact)) }

// Head returns the head (see storage.Store): one GET.
func (s *Store) Head(ctx context.Context) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	h, err := s.c.Get(ctx, s.p+"head").Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("replaydredis: head: %w", err)
	}
	s.saw(h)
	return h, nil
}

// Read returns a page of the scope's events (see storage.Store).
func (s *Store) Read(ctx context.Context, req storage.ReadRequest) (storage.Page, error) {
	if s.isClosed() {
		return storage.Page{}, ErrClosed
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 100
	}
	args := []any{s.p, seqArg(req.After), seqArg(max(req.Through, 0)), strconv.Itoa(limit), strconv.Itoa(max(req.MaxBytes, 0))}
	v, err := readScript.Run(ctx, s.c, nil, scopeArgs(args, req.Scope)...).Slice()
	if err != nil {
		return storage.Page{}, fmt.Errorf("replaydredis: read: %w", err)
	}
	if len(v) != 5 {
		return storage.Page{}, fmt.Errorf("replaydredis: read: %d fields", len(v))
	}
	raw, _ := v[4].([]any)
	p := storage.Page{Head: v[0].(int64), Watermark: v[1].(int64), Foreign: v[2].(int64) == 1, More: v[3].(int64) == 1,
		Events: make([]storage.Event, 0, len(raw))}
	for _, r := range raw {
		f, _ := r.([]any)
		e, err := eventOf(f)
		if err != nil {
			return storage.Page{}, fmt.Errorf("replaydredis: read: %w", err)
		}
		p.Events = append(p.Events, e)
	}
	s.saw(p.Head)
	return p, nil
}

// Window returns what a client resuming from cursor needs (see
// storage.Store).
func (s *Store) Window(ctx context.Context, scope []string, cursor int64, limit int) (storage.Window, error) {
	if s.isClosed() {
		return storage.Window{}, ErrClosed
	}
	args := []any{s.p, seqArg(cursor), strconv.Itoa(max(limit, 0))}
	v, err := windowScript.Run(ctx, s.c, nil, scopeArgs(args, scope)...).Int64Slice()
	if err != nil {
		return storage.Window{}, fmt.Errorf("replaydredis: window: %w", err)
	}
	if len(v) != 7 {
		return storage.Window{}, fmt.Errorf("replaydredis: window: %d fields", len(v))
	}
	s.saw(v[0])
	return storage.Window{Head: v[0], From: v[1], Skipped: storage.Span{Count: v[2], First: v[3], Last: v[4]},
		Watermark: v[5], Foreign: v[6] == 1}, nil
}

// Count returns how many events of scope are retained strictly between
// after and before (see storage.Counter): a ZCOUNT per topic.
func (s *Store) Count(ctx context.Context, scope []string, after, before int64) (int64, error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	if before <= after || before-after == 1 {
		return 0, nil
	}
	v, err := countScript.Run(ctx, s.c, nil, scopeArgs([]any{s.p, seqArg(after), seqArg(before)}, scope)...).Int64()
	if err != nil {
		return 0, fmt.Errorf("replaydredis: count: %w", err)
	}
	return v, nil
}
