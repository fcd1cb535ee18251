package replaydredis

// Append: one script that guards the head, takes duplicates out, assigns
// sequences and writes the events (the package doc, "One script per
// operation").

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/replayd/replayd/storage"
)

// appendScript: ARGV[2] the highest sequence the store knows its log
// issued, ARGV[3] the number of events, then four arguments per event: id,
// type, topic, payload. It returns the batch's created_at and one result
// per event: {'n', sequence} for a stored one, {'o', the original's fields
// (see load)} for a duplicate of a stored one, {'b', index} for a
// duplicate of an earlier one of the batch. The head's guard (see guard in lua.go) runs first.
var appendScript = newScript(`
local n = tonumber(ARGV[3])
local now = clock()
local head = guard(num(ARGV[2]), now)
local at = math.max(now, num(redis.call('GET', P .. 'at')))
local out, batch, fresh = {at}, {}, 0
for i = 1, n do
	local b = 3 + (i - 1) * 4
	local id = ARGV[b + 1]
	local r
	if batch[id] then
		r = {'b', batch[id]}
	else
		local stored = redis.call('HGET', P .. 'ids', id)
		local e = stored and load(tonumber(stored))
		if e then
			r = {'o', e[1], e[2], e[3], e[4], e[5], e[6]}
		else
			head = head + 1
			fresh = fresh + 1
			local seq = str(head)
			put(seq, id, ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], str(at))
			r = {'n', head}
			batch[id] = i
		end
	end
	out[i + 1] = r
end
if fresh > 0 then
	redis.call('SET', P .. 'head', str(head))
	redis.call('SET', P .. 'at', str(at))
end
return out
`)

// Append stores evs as one atomic batch (see storage.Store).
func (s *Store) Append(ctx context.Context, evs []storage.Event) ([]storage.AppendResult, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	if len(evs) == 0 {
		return []storage.AppendResult{}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	args := make([]any, 0, 3+4*len(evs))
	args = append(args, s.p, strconv.FormatInt(s.issued.Load(), 10), strconv.Itoa(len(evs)))
	for _, e := range evs {
		args = append(args, e.EventID, e.Type, e.Topic, []byte(e.Payload))
	}
	v, err := appendScript.Run(ctx, s.c, nil, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("replaydredis: append: %w", outcome(err))
	}
	if len(v) != len(evs)+1 {
		return nil, fmt.Errorf("replaydredis: append: %d results for %d events", len(v)-1, len(evs))
	}
	at := time.UnixMicro(v[0].(int64))
	out := make([]storage.AppendResult, len(evs))
	var last int64
	for i, r := range v[1:] {
		f, _ := r.([]any)
		if len(f) < 2 {
			return nil, fmt.Errorf("replaydredis: append: result %d is %v", i, r)
		}
		switch f[0] {
		case "n":
			e := evs[i]
			e.Sequence, e.CreatedAt = f[1].(int64), at
			out[i] = storage.AppendResult{Event: e}
			last = e.Sequence
		case "o":
			e, err := eventOf(f[1:])
			if err != nil {
				return nil, fmt.Errorf("replaydredis: append: %w", err)
			}
			out[i] = storage.AppendResult{Event: e, Duplicate: true}
		case "b":
			out[i] = storage.AppendResult{Event: out[f[1].(int64)-1].Event, Duplicate: true}
		}
	}
	s.saw(last)
	return out, nil
}

// eventOf decodes an event a script returned as load does: {seq, id, type,
// topic, payload, created}.
func eventOf(f []any) (storage.Event, error) {
	if len(f) != 6 {
		return storage.Event{}, fmt.Errorf("an event of %d fields", len(f))
	}
	seq, ok0 := f[0].(int64)
	id, ok1 := f[1].(string)
	typ, ok2 := f[2].(string)
	topic, ok3 := f[3].(string)
	payload, ok4 := f[4].(string)
	created, ok5 := f[5].(int64)
	if !ok0 || !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return storage.Event{}, fmt.Errorf("an event of unexpected types: %v", f)
	}
	return storage.Event{Sequence: seq, EventID: id, Type: typ, Topic: topic, Payload: []byte(payload), CreatedAt: time.UnixMicro(created)}, nil
}
