// Child processes for client.test.mjs: `replayd serve` (built from this
// tree by client.sh) on a SQLite file or on PostgreSQL, and rrproxy in
// front of two nodes. Each start waits for the process's own "ready" line
// (replayd's JSON log record "serving", rrproxy's "listening on"), bounded,
// and fails with the process's output when it exits first or the bound
// passes. Nothing here speaks the Durable Streams protocol: the tests do
// that through @durable-streams/client only.
import { spawn } from "node:child_process"
import { once } from "node:events"

const startTimeoutMs = 20_000

// Every child still running when this process exits (a test that threw
// past its cleanup, a timeout) is SIGKILLed, so none outlives the run.
const running = new Set()
process.on("exit", () => {
  for (const proc of running) proc.kill("SIGKILL")
})

// A started child: its process, the address it listens on, its output so far.
class Child {
  constructor(name, proc) {
    this.name = name
    this.proc = proc
    this.output = ""
    this.exited = once(proc, "exit")
    running.add(proc)
    proc.on("exit", () => running.delete(proc))
  }

  // kill sends signal and waits, bounded, until the process has exited.
  async kill(signal = "SIGTERM") {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return
    this.proc.kill(signal)
    await withTimeout(this.exited, 10_000, `${this.name} did not exit on ${signal}`)
  }
}

// start runs bin with args and resolves once ready(line) returns an
// address for a line of its output.
async function start(name, bin, args, ready) {
  const proc = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] })
  const child = new Child(name, proc)
  const addr = new Promise((resolve, reject) => {
    let pending = ""
    const onData = (chunk) => {
      const text = chunk.toString()
      child.output += text
      pending += text
      let nl
      while ((nl = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, nl)
        pending = pending.slice(nl + 1)
        const a = ready(line)
        if (a) resolve(a)
      }
    }
    proc.stdout.on("data", onData)
    proc.stderr.on("data", onData)
    proc.on("error", reject)
    proc.on("exit", (code, signal) =>
      reject(new Error(`${name} exited (${code ?? signal}) before it was ready:\n${child.output}`))
    )
  })
  try {
    child.addr = await withTimeout(addr, startTimeoutMs, `${name} not ready after ${startTimeoutMs} ms`)
  } catch (err) {
    proc.kill("SIGKILL")
    throw new Error(`${err.message}\n${child.output}`)
  }
  return child
}

// startReplayd starts `replayd serve --streams-dev` listening on listen
// (host:port; port 0 picks a free one) with store flags (["--db", FILE] or
// ["--postgres", DSN, ...]). child.addr is "host:port".
export function startReplayd(bin, listen, storeArgs) {
  const args = ["serve", "--listen", listen, "--streams-dev", "--log-level", "info", ...storeArgs]
  return start("replayd serve", bin, args, (line) => {
    try {
      const rec = JSON.parse(line)
      return rec.msg === "serving" ? rec.addr : undefined
    } catch {
      return undefined
    }
  })
}

// startRRProxy starts rrproxy in front of the upstream URLs on a free port.
export function startRRProxy(bin, upstreams) {
  return start("rrproxy", bin, ["-listen", "127.0.0.1:0", ...upstreams], (line) => {
    const m = /^rrproxy: listening on http:\/\/(\S+)$/.exec(line)
    return m ? m[1] : undefined
  })
}

// withTimeout resolves as p does, or rejects with message after ms.
export function withTimeout(p, ms, message) {
  let timer
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(message)), ms)
  })
  return Promise.race([p, t]).finally(() => clearTimeout(timer))
}
