// Starts the protocol's own Node reference server (@durable-streams/server),
// for measuring the conformance suite (and, later, performance) against it.
//
//   node reference.mjs [PORT] [DATA_DIR]
//
// PORT defaults to 4437; with DATA_DIR the server keeps its streams in files
// there (its file-backed store), else in memory. It listens on 127.0.0.1,
// prints its base URL on stdout once it accepts connections, and stops on
// SIGTERM or SIGINT.
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.argv[2] ?? 4437)
const dataDir = process.argv[3]
const server = new DurableStreamTestServer({
  port,
  host: "127.0.0.1",
  ...(dataDir ? { dataDir } : {}),
})
await server.start()
console.log(server.url ?? `http://127.0.0.1:${port}`)

const stop = async () => {
  await server.stop()
  process.exit(0)
}
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
