package replaydredis

// The sequence floor and the log identity (the package doc, "Log
// identity"): Open's raise of the head to the clock, the identity check
// every new connection runs before any command, and saw, which keeps the
// highest sequence a Store knows its log issued for the append's guard
// (append.go).

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// openScript raises the head to Redis's clock if it is below it, recording
// the range skipped; a head lost or below what the keys tell (the
// stream's last id, the watermarks, the skipped ranges) is first repaired
// to it. It returns the head.
var openScript = newScript(`
local old = highest()
local now = clock()
if now > old then
	raise(old, now)
	return now
end
redis.call('SET', P .. 'head', str(old))
return old
`)

// identityScript, ARGV[2] the server's run_id: if {P}:run is another, the
// log is in a Redis process that never checked it (a restart, a
// failover), which may have lost acknowledged writes: it raises the floor
// as an open does and stores the run_id. A log never opened (no head, no
// run_id) is only marked. It returns {old head, new head}, equal when
// nothing was raised.
var identityScript = newScript(`
local cur = redis.call('GET', P .. 'run')
if cur == ARGV[2] then return {0, 0} end
redis.call('SET', P .. 'run', ARGV[2])
if not cur and not redis.call('GET', P .. 'head') then return {0, 0} end
local old = highest()
local now = clock()
if now > old then
	raise(old, now)
	return {old, now}
end
redis.call('SET', P .. 'head', str(old))
return {old, old}
`)

// checkIdentity runs the identity check on a new connection, before any
// other command of it (go-redis's OnConnect).
func (s *Store) checkIdentity(ctx context.Context, cn *redis.Conn) error {
	info, err := cn.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("replaydredis: INFO server: %w", err)
	}
	runID := infoField(info, "run_id")
	if runID == "" {
		return fmt.Errorf("replaydredis: INFO server has no run_id")
	}
	r, err := identityScript.Run(ctx, cn, nil, s.p, runID).Int64Slice()
	if err != nil {
		return fmt.Errorf("replaydredis: identity check: %w", err)
	}
	if r[0] != r[1] {
		s.saw(r[1])
		s.logger.Warn("replaydredis: the log is in a Redis process that never held it (a restart or a failover), which may have lost acknowledged writes: raised the sequence floor so that no sequence is issued twice and cursors of a lost history get unknown_cursor",
			"prefix", s.prefix, "run_id", runID, "head", r[0], "raisedTo", r[1])
	}
	return nil
}

// infoField returns the value of key in the text of an INFO reply.
func infoField(info, key string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

// saw records that the log issued seq (an append's, or a head read).
func (s *Store) saw(seq int64) {
	for {
		cur := s.issued.Load()
		if seq <= cur || s.issued.CompareAndSwap(cur, seq) {
			return
		}
	}
}
