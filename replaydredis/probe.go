package replaydredis

// ProbeWrite, which EventHub.Ready calls.

import (
	"context"
	"fmt"
)

// probeScript writes nothing, but its shebang without the no-writes flag
// makes Redis treat it as a write: Redis refuses it where it would refuse
// an append (a read-only replica, maxmemory reached with
// noeviction, min-replicas-to-write not met, a failing disk under
// stop-writes-on-bgsave-error).
var probeScript = newScriptRaw("#!lua\nreturn 1\n")

// ProbeWrite reports whether an append could get through now, writing
// nothing (see storage.WriteProber).
func (s *Store) ProbeWrite(ctx context.Context) error {
	if s.isClosed() {
		return ErrClosed
	}
	if err := probeScript.Run(ctx, s.c, nil).Err(); err != nil {
		return fmt.Errorf("replaydredis: probe: %w", err)
	}
	return nil
}
