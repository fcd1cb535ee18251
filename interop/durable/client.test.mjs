// The protocol's official TypeScript client, @durable-streams/client (pinned
// in package-lock.json), writing to and reading from `replayd serve
// --streams-dev` built from this tree (issue 27 item 7, SPEC §19). Every
// request goes through the client's API: nothing here builds a URL query,
// a header or a body of the protocol by hand. Run by client.sh with
// node --test:
//
//	REPLAYD_BIN=...                     replayd serve on a fresh SQLite file
//	REPLAYD_BIN=... RRPROXY_BIN=... CLIENT_TEST_PG_DSN=DSN
//	                                    two replayd serve --postgres nodes on a
//	                                    fresh table prefix behind rrproxy (each
//	                                    request to the other node)
//
// The restart tests SIGKILL every replayd process while a client reads the
// stream live and a producer appends to it, start them again on the same
// store and ports, and require the reader to end with messages 0..N-1,
// each once, in order. See README.md for what the client does by itself
// there and what the test does for it.
import { after, before, describe, test } from "node:test"
import assert from "node:assert/strict"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  DurableStream,
  FetchError,
  IdempotentProducer,
  StaleEpochError,
  StreamClosedError,
  createFetchWithBackoff,
  stream,
} from "@durable-streams/client"
import { startReplayd, startRRProxy, withTimeout } from "./client-server.mjs"

const bin = process.env.REPLAYD_BIN
if (!bin) throw new Error("REPLAYD_BIN is required (a replayd binary); use client.sh")
const pgDSN = process.env.CLIENT_TEST_PG_DSN
const rrproxyBin = process.env.RRPROXY_BIN
if (pgDSN && !rrproxyBin) throw new Error("CLIENT_TEST_PG_DSN needs RRPROXY_BIN; use client.sh --pg")

const testTimeout = 60_000 // each test; every wait inside is bounded below it
const waitMs = 20_000 // longest wait for one expected delivery

// The client's own retry: exponential backoff with jitter, for network
// errors and 5xx (a server being restarted, a proxy's 502). Its default
// caps the delay at 60 s; a test wants the reconnect within a second.
const backoffOptions = { initialDelay: 50, maxDelay: 500, multiplier: 1.5, maxRetries: 200 }

// A deployment: one SQLite node, or two PostgreSQL nodes behind rrproxy.
// restart() SIGKILLs every replayd node and starts each again on the
// same store and address; the proxy stays.
class Deployment {
  static async start() {
    const d = new Deployment()
    d.dir = mkdtempSync(join(tmpdir(), "ds-client-"))
    if (pgDSN) {
      // A fresh table prefix, like run.sh --replayd-pg: its tables stay in
      // the throwaway cluster.
      const prefix = `dsc${Date.now()}_${process.pid}_`
      d.storeArgs = ["--postgres", pgDSN, "--postgres-table-prefix", prefix]
      d.nodes = [
        await startReplayd(bin, "127.0.0.1:0", d.storeArgs),
        await startReplayd(bin, "127.0.0.1:0", d.storeArgs),
      ]
      d.proxy = await startRRProxy(rrproxyBin, d.nodes.map((n) => `http://${n.addr}`))
      d.base = `http://${d.proxy.addr}`
    } else {
      d.storeArgs = ["--db", join(d.dir, "replayd.db")]
      d.nodes = [await startReplayd(bin, "127.0.0.1:0", d.storeArgs)]
      d.base = `http://${d.nodes[0].addr}`
    }
    return d
  }

  url(name) {
    return `${this.base}/v1/stream/client-test/${name}`
  }

  async restart() {
    await Promise.all(this.nodes.map((n) => n.kill("SIGKILL")))
    this.nodes = await Promise.all(this.nodes.map((n) => startReplayd(bin, n.addr, this.storeArgs)))
  }

  async stop() {
    await Promise.all([...this.nodes, this.proxy].filter(Boolean).map((c) => c.kill("SIGTERM")))
    rmSync(this.dir, { recursive: true, force: true })
  }
}

// follow reads a stream live with the client's stream() and
// subscribeJson (or subscribeBytes, with bytes set) until the stream is
// closed, collecting every item (or chunk) in r.items and the metadata of
// every batch in r.batches.
//
// The end: the session ends normally with res.streamClosed, and the last
// batch the subscriber was handed is at the session's offset. The client
// resolves `closed` when its response stream ends, which can be before
// the subscriber has been handed the last batch (so follow waits for
// that batch), and a close that arrives on its own in an SSE control event
// (`{streamNextOffset, streamClosed: true}`, which the reference server
// sends too) updates the session's state without a batch that says so.
//
// A session that ends with an error (a connection cut mid-response, see
// README.md) is resumed when resume is set: a new session from the offset
// of the last batch the client delivered, as the client's README says to
// resume. Batches the old session still hands over after that are
// ignored, so nothing is counted twice. r.resumes counts the new
// sessions; r.caughtUp resolves at the first up-to-date batch; onBatch(r)
// runs after each batch is counted.
function follow(url, live, { resume = false, bytes = false, fetch: f, offset = "-1", onBatch = () => {}, backoff = backoffOptions } = {}) {
  const r = { items: [], batches: [], resumes: 0, errors: [], offset }
  let caughtUp
  r.caughtUp = withTimeout(new Promise((resolve) => (caughtUp = resolve)), waitMs, "the reader was never up to date")
  let wake = () => {}
  r.done = (async () => {
    for (;;) {
      const session = { dead: false }
      const res = await stream({ url, live, offset: r.offset, backoffOptions: backoff, fetch: f })
      const take = (batch, got) => {
        if (session.dead) return
        r.items.push(...got)
        r.offset = batch.offset
        r.batches.push({ n: got.length, offset: batch.offset, upToDate: batch.upToDate, closed: batch.streamClosed })
        if (batch.upToDate) caughtUp()
        onBatch(r)
        wake()
      }
      if (bytes) res.subscribeBytes(async (chunk) => take(chunk, [chunk.data]))
      else res.subscribeJson(async (batch) => take(batch, batch.items))
      const err = await res.closed.then(
        () => null,
        (e) => e ?? new Error("the session failed")
      )
      if (err === null && res.streamClosed) {
        const drained = (async () => {
          while (r.offset !== res.offset) await new Promise((resolve) => (wake = resolve))
        })()
        await withTimeout(drained, waitMs, `the session ended closed at ${res.offset}; the last batch was at ${r.offset}`)
        r.res = res
        return r
      }
      session.dead = true
      r.errors.push(String(err?.cause?.code ?? err?.message ?? "the session ended before the stream was closed"))
      if (!resume) throw new Error(`the ${live} session ended before the stream was closed: ${r.errors}`)
      if (++r.resumes > 20) throw new Error(`resumed ${r.resumes} times: ${r.errors}`)
    }
  })()
  return r
}

// recordingFetch is the client's `fetch` option: it records each request's
// method and URL, so a test can tell which live mode the client used.
function recordingFetch() {
  const requests = []
  const f = (input, init) => {
    requests.push(`${init?.method ?? "GET"} ${input}`)
    return fetch(input, init)
  }
  return { fetch: f, requests }
}

const msgs = (from, to) => Array.from({ length: to - from }, (_, i) => ({ n: from + i }))
const encode = (v) => JSON.stringify(v)

describe(`@durable-streams/client against replayd (${pgDSN ? "two PostgreSQL nodes behind rrproxy" : "SQLite"})`, () => {
  let dep
  before(async () => {
    dep = await Deployment.start()
  })
  after(async () => {
    await dep?.stop()
  })

  test("JSON stream: create, append, idempotent producer, catch-up", { timeout: testTimeout }, async () => {
    const url = dep.url("json")
    const handle = await DurableStream.create({ url, contentType: "application/json" })
    let head = await handle.head()
    assert.equal(head.exists, true)
    assert.equal(head.contentType, "application/json")
    assert.equal(head.streamClosed, false)
    const empty = head.offset
    assert.match(empty, /^\S+$/)

    // The handle's own append, one awaited and three batched.
    await handle.append(encode({ n: 0 }))
    await Promise.all([1, 2, 3].map((n) => handle.append(encode({ n }))))

    // The idempotent producer: batched, pipelined, exactly once.
    const errors = []
    const producer = new IdempotentProducer(handle, "writer-1", { onError: (e) => errors.push(e) })
    for (const m of msgs(4, 10)) producer.append(encode(m))
    await producer.flush()
    await producer.detach()
    assert.deepEqual(errors, [])

    const res = await handle.stream({ live: false })
    assert.deepEqual(await res.json(), msgs(0, 10))
    assert.equal(res.upToDate, true)
    assert.equal(res.streamClosed, false)
    head = await handle.head()
    assert.equal(res.offset, head.offset, "catch-up ends at the tail HEAD reports")
    assert.ok(head.offset > empty, "the tail moved past the empty stream's offset")

    // The same producer id and epoch again starts at seq 0: the server has
    // those sequences, so the batch is a duplicate, acknowledged, not stored.
    const replay = new IdempotentProducer(handle, "writer-1", { epoch: 0, onError: (e) => errors.push(e) })
    replay.append(encode({ n: "duplicate" }))
    await replay.flush()
    await replay.detach()
    assert.deepEqual(errors, [])
    assert.equal((await handle.head()).offset, head.offset, "a duplicate batch appends nothing")

    // A new epoch fences the old one.
    const next = new IdempotentProducer(handle, "writer-1", { epoch: 1, onError: (e) => errors.push(e) })
    next.append(encode({ n: 10 }))
    await next.flush()
    const stale = new IdempotentProducer(handle, "writer-1", { epoch: 0, onError: (e) => errors.push(e) })
    stale.append(encode({ n: "stale" }))
    await stale.flush().catch((e) => errors.push(e))
    assert.ok(errors.length > 0 && errors.every((e) => e instanceof StaleEpochError), `errors: ${errors}`)
    assert.equal(errors[0].currentEpoch, 1)

    const all = await (await stream({ url, live: false })).json()
    assert.deepEqual(all, msgs(0, 11))
  })

  test("resume from an offset the client reported, and from now", { timeout: testTimeout }, async () => {
    const url = dep.url("resume")
    const handle = await DurableStream.create({ url, contentType: "application/json" })
    for (const m of msgs(0, 5)) await handle.append(encode(m))
    const first = await handle.stream({ live: false })
    assert.deepEqual(await first.json(), msgs(0, 5))
    const saved = first.offset
    for (const m of msgs(5, 9)) await handle.append(encode(m))

    const rest = await stream({ url, offset: saved, live: false })
    assert.deepEqual(await rest.json(), msgs(5, 9), "from the saved offset: the later messages, none twice")
    const tail = await stream({ url, offset: rest.offset, live: false })
    assert.deepEqual(await tail.json(), [], "from the tail: nothing")
    assert.equal(tail.upToDate, true)

    const now = await stream({ url, offset: "now", live: false })
    assert.deepEqual(await now.json(), [])
    assert.equal(now.offset, rest.offset, "offset now is the tail")
  })

  for (const live of ["long-poll", "sse"]) {
    test(`live ${live}: JSON messages as they are appended, then close`, { timeout: testTimeout }, async () => {
      const url = dep.url(`live-json-${live}`)
      const handle = await DurableStream.create({ url, contentType: "application/json" })
      for (const m of msgs(0, 2)) await handle.append(encode(m))

      const rec = recordingFetch()
      const c = follow(url, live, { fetch: rec.fetch })
      // Append only once the reader is caught up, so these arrive live.
      await c.caughtUp

      const producer = new IdempotentProducer(handle, "live-writer", { lingerMs: 0 })
      for (const m of msgs(2, 6)) {
        producer.append(encode(m))
        await producer.flush()
      }
      await producer.close(encode({ n: 6 }))
      await withTimeout(c.done, waitMs, `no close within ${waitMs} ms`)
      assert.deepEqual(c.items, msgs(0, 7))
      const last = c.batches.at(-1)
      // The final message came with the close, so its batch says closed.
      // (Its upToDate is false on SSE: the client takes it from the control
      // event, where the protocol implies it by streamClosed.)
      assert.equal(last.closed, true, "the last batch says the stream is closed")
      assert.equal(c.res.streamClosed, true)
      assert.equal(c.res.upToDate, true)
      assert.equal(last.offset, (await handle.head()).offset)
      await withTimeout(c.res.closed, waitMs, "the session did not end after close")
      assert.ok(
        rec.requests.some((r) => r.includes(`live=${live}`)),
        `the client used live=${live}: ${rec.requests.join(", ")}`
      )
    })
  }

  test("byte stream: catch-up, long-poll and SSE (base64) deliver the exact bytes", { timeout: testTimeout }, async () => {
    const url = dep.url("bytes")
    const handle = await DurableStream.create({ url, contentType: "application/octet-stream" })
    const all = Uint8Array.from({ length: 256 }, (_, i) => i) // every byte value, not UTF-8
    await handle.append(all.subarray(0, 100))
    await handle.append(all.subarray(100, 200))

    const catchup = await stream({ url, live: false })
    assert.deepEqual(await catchup.body(), all.subarray(0, 200))
    assert.equal(catchup.upToDate, true)

    const readers = ["long-poll", "sse"].map((live) => {
      const rec = recordingFetch()
      return { live, rec, r: follow(url, live, { bytes: true, fetch: rec.fetch }) }
    })
    for (const { r } of readers) await r.caughtUp
    // Both readers are caught up: the rest arrives live, then a close on
    // its own (no final bytes).
    await handle.append(all.subarray(200, 256))
    await handle.close()
    for (const { live, rec, r } of readers) {
      await withTimeout(r.done, waitMs, `${live}: stream not closed`)
      assert.deepEqual(new Uint8Array(Buffer.concat(r.items)), all, `${live}: bytes`)
      assert.equal(r.res.streamClosed, true)
      assert.ok(rec.requests.some((q) => q.includes(`live=${live}`)), `${live}: ${rec.requests}`)
    }
    const head = await handle.head()
    assert.equal(head.streamClosed, true)
    assert.equal(head.contentType, "application/octet-stream")
  })

  test("text stream, a stream created closed, append after close, delete", { timeout: testTimeout }, async () => {
    const text = await DurableStream.create({ url: dep.url("text"), contentType: "text/plain" })
    await text.append("héllo, ")
    await text.append("wörld\n")
    assert.equal(await (await text.stream({ live: false })).text(), "héllo, wörld\n")

    const closedUrl = dep.url("created-closed")
    const closed = await DurableStream.create({
      url: closedUrl,
      contentType: "application/json",
      body: encode([{ n: 0 }]),
      closed: true,
    })
    const res = await stream({ url: closedUrl, live: true })
    assert.deepEqual(await res.json(), [{ n: 0 }])
    assert.equal(res.streamClosed, true)
    const tail = (await closed.head()).offset
    // append() and close() with a final message on a closed stream: 409.
    // The client 0.2.7 maps a 409 with Stream-Closed to StreamClosedError
    // only after its backoff wrapper, which has already turned every 4xx
    // into a FetchError, so the closed state is in that error's status and
    // headers (the same against the reference server).
    for (const [what, call] of [
      ["append", () => closed.append(encode({ n: 1 }))],
      ["close with a body", () => closed.close({ body: encode({ n: 1 }) })],
    ]) {
      const err = await call().then(
        () => null,
        (e) => e
      )
      assert.ok(err instanceof FetchError || err instanceof StreamClosedError, `${what} after close: ${err}`)
      assert.equal(err.status, 409, what)
      if (err instanceof FetchError) {
        assert.equal(err.headers["stream-closed"], "true", what)
        assert.equal(err.headers["stream-next-offset"], tail, what)
      } else {
        assert.equal(err.finalOffset, tail, what)
      }
    }
    assert.equal((await closed.close()).finalOffset, tail, "close() without a body again: idempotent")
    assert.deepEqual(await (await closed.stream({ live: false })).json(), [{ n: 0 }], "nothing appended")

    await text.delete()
    const gone = await text.head()
    assert.equal(gone.exists, false)
    assert.deepEqual(await DurableStream.head({ url: dep.url("never-created") }), { exists: false })
  })

  // The restart: a producer appends N numbered messages, one request each;
  // a reader follows live. When the reader has half, every replayd node is
  // SIGKILLed and started again on the same store and address while the
  // producer goes on (its requests retried by the client's backoff, the
  // same Producer-Id/epoch/seq, so a batch the server stored before dying
  // is acknowledged as a duplicate). The producer closes the stream at the
  // end; the reader must hold exactly 0..N-1.
  const N = 200
  for (const live of ["long-poll", "sse"]) {
    test(`restart mid-read (${live}): messages 0..${N - 1}, each once, in order`, { timeout: testTimeout }, async (t) => {
      const url = dep.url(`restart-${live}`)
      const handle = await DurableStream.create({ url, contentType: "application/json", backoffOptions })

      // The reader: the client's live session, resumed by follow() if
      // the client gives up (see README.md).
      let half
      const halfway = new Promise((resolve) => (half = resolve))
      // Each client counts the requests its backoff retried.
      const retried = { reader: 0, writer: 0 }
      const counting = (who) => ({ ...backoffOptions, onFailedAttempt: () => retried[who]++ })
      const r = follow(url, live, {
        resume: true,
        backoff: counting("reader"),
        onBatch: (r) => r.items.length >= N / 2 && half(),
      })

      // The writer pauses at 60 % until the kill is sent, so the kill
      // lands mid-write whatever the timing; then it appends the rest
      // into the dead and restarting server.
      const perr = []
      const producer = new IdempotentProducer(handle, "restart-writer", {
        maxInFlight: 1, // retried batches must arrive in order
        lingerMs: 0,
        fetch: createFetchWithBackoff((...a) => fetch(...a), counting("writer")),
        onError: (e) => perr.push(e),
      })
      let killSent
      const killed = new Promise((resolve) => (killSent = resolve))
      const writer = (async () => {
        for (let n = 0; n < N; n++) {
          if (n === (N * 3) / 5) await killed
          producer.append(encode({ n }))
          await producer.flush()
        }
        await producer.close()
      })()

      await withTimeout(halfway, waitMs, `the reader never had ${N / 2} messages`)
      const readAtKill = r.items.length
      const restart = dep.restart()
      killSent()
      await withTimeout(restart, waitMs, "restart")
      await withTimeout(writer, waitMs * 2, "writer did not finish")
      await withTimeout(r.done, waitMs * 2, `reader has ${r.items.length} of ${N}`)
      const items = r.items.map((m) => m.n)

      assert.deepEqual(perr, [], "producer errors")
      assert.ok(readAtKill < N, `the kill came mid-read (${readAtKill} of ${N} read)`)
      assert.equal(items.length, N, `read ${items.length}, want ${N}`)
      assert.deepEqual(items, Array.from({ length: N }, (_, i) => i), "0..N-1, each once, in order")
      const head = await handle.head()
      assert.equal(head.streamClosed, true)
      assert.equal(r.offset, head.offset, "the reader ends at the tail")
      t.diagnostic(
        `${live}: read ${readAtKill} of ${N} before the kill; requests retried by the client's backoff: ` +
          `reader ${retried.reader}, writer ${retried.writer}; sessions resumed by the test: ${r.resumes} (${r.errors.join(", ") || "none"})`
      )
      assert.ok(retried.writer > 0, "the writer's requests met the dead server and were retried")
      if (live === "long-poll") {
        assert.equal(r.resumes, 0, "long-poll: the client's own retries carry the session over the restart")
        assert.ok(retried.reader > 0, "long-poll: the reader's poll met the dead server and was retried")
      }
    })
  }
})
