package durable

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// Stream-Cursor collapses live requests in a CDN's cache: the number of
// the 20-second interval since the protocol's epoch. A client that echoes
// a cursor at or above the current interval (its clock, or a cache, is
// ahead) gets a larger one, by a random 1 s to 1 h, so that its next
// request is a new cache key.
var cursorEpoch = time.Date(2024, 10, 9, 0, 0, 0, 0, time.UTC)

const cursorInterval = 20 * time.Second

func (h *Handler) cursor(client string) string {
	cur := int64(h.Now().Sub(cursorEpoch) / cursorInterval)
	if c, err := strconv.ParseInt(client, 10, 64); err == nil && c >= cur {
		jitter := 1 + rand.Int64N(3600)
		cur = c + max(1, jitter/int64(cursorInterval/time.Second))
	}
	return strconv.FormatInt(cur, 10)
}
