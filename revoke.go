package replayd

import "context"

// Revocation (docs/authorization.md in the repository). A request's own context is no
// handle on a stream's access: a detached stream outlives it
// (DetachConnections), and middleware that cancels it must keep one
// context per request. A revocation context is the caller's (a session's,
// a membership's), carried as a value of the request's context; a stream
// watches it with context.AfterFunc for as long as it runs, and unregisters
// when it ends, so nothing of the stream stays behind in the caller's
// context, however long that lives.

// WithRevocation returns a copy of parent that carries revoked: an SSE
// stream served on a request with that context ends as soon as revoked is
// done, and a long poll waiting on such a request is answered at once, as
// if its wait had run out. The client comes back (an EventSource
// reconnects with its Last-Event-ID; a poll client polls again) and
// Options.Authorize decides again. Unlike the request's own context it
// reaches a stream served with SSEOptions.DetachConnections, and it can be
// shared by every request of a session: middleware puts it on the request,
//
//	r = r.WithContext(replayd.WithRevocation(r.Context(), session.ctx))
//
// and logging out cancels session.ctx. Only revoked's Done is used, not
// its values. Calling WithRevocation again on the result adds revoked to
// those it carries: the request loses its access when any of them is done.
//
// Nothing the log holds reaches a request after revoked is done, however
// the revocation and the request's setup interleave: the hub looks at
// revoked before each log read and before each write, not only through the
// watch that ends the stream. A request whose revoked is done before it is
// served (when it arrives, or while Authorize runs) is refused, counted
// under "forbidden" (Metrics.RefusedForbidden):
//
//   - an SSE stream gets 200 text/event-stream holding a comment only, no
//     hello: a stream that ends, as one revoked later does, so that an
//     EventSource reconnects and Authorize decides (a 403 would make it
//     stop for good, whoever logs in next in that page);
//   - a poll, immediate or long, gets 403 "access revoked".
//
// A stream revoked while it is set up ends before its hello if the hello
// was not written yet (during its first log read, say), and otherwise
// writes nothing it read after the revocation: a replay ends after the
// page being written. A poll revoked during its log read gets 403 as
// above; one revoked in the read that follows a wake is answered as if its
// wait had run out. Only a write already under way when revoked is done
// may still arrive, as when a client leaves.
func WithRevocation(parent, revoked context.Context) context.Context {
	prev := revocations(parent)
	all := make([]context.Context, len(prev), len(prev)+1)
	copy(all, prev)
	return context.WithValue(parent, revocationKey{}, append(all, revoked))
}

type revocationKey struct{}

// revocations returns the revocation contexts ctx carries (WithRevocation).
func revocations(ctx context.Context) []context.Context {
	rs, _ := ctx.Value(revocationKey{}).([]context.Context)
	return rs
}

// onRevoked arranges for cancel to be called once any revocation context
// ctx carries is done. stop unregisters; it must be called when the
// stream ends, and cancel is not called after it returned unless it was
// running already. Without revocations it costs nothing.
func onRevoked(ctx context.Context, cancel func()) (stop func()) {
	rs := revocations(ctx)
	switch len(rs) {
	case 0:
		return func() {}
	case 1:
		s := context.AfterFunc(rs[0], cancel)
		return func() { s() }
	}
	stops := make([]func() bool, len(rs))
	for i, rc := range rs {
		stops[i] = context.AfterFunc(rc, cancel)
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// isRevoked reports whether a revocation context ctx carries is done. The
// watch (onRevoked) ends a stream's context from another goroutine, soon
// but not at once; a request checks this before each step that reads the
// log or writes an event, so that a revocation done before the step
// stops it, whatever the watch's goroutine is doing. It costs a context
// lookup, and nothing per stream.
func isRevoked(ctx context.Context) bool {
	for _, rc := range revocations(ctx) {
		select {
		case <-rc.Done():
			return true
		default:
		}
	}
	return false
}

// watchRevocation is a stream's revocation step: once a revocation
// context its request carries is done, the stream's context ends. A stream
// on its handler gets a context of its own for that; a detached one has one
// already (detach). end stops the watch. Without revocations it does
// nothing.
func (c *sseStream) watchRevocation() {
	if len(revocations(c.ctx)) == 0 {
		return
	}
	if c.cancel == nil {
		c.ctx, c.cancel = context.WithCancel(c.ctx)
	}
	c.unrevoke = onRevoked(c.ctx, c.cancel)
}

// revokedChan returns a channel closed once a revocation context ctx
// carries is done (nil without revocations: it never is), and the function
// that releases it.
func revokedChan(ctx context.Context) (<-chan struct{}, func()) {
	switch rs := revocations(ctx); len(rs) {
	case 0:
		return nil, func() {}
	case 1:
		return rs[0].Done(), func() {}
	}
	rctx, cancel := context.WithCancel(context.Background())
	stop := onRevoked(ctx, cancel)
	return rctx.Done(), func() {
		stop()
		cancel()
	}
}
