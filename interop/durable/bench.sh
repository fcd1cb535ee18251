#!/usr/bin/env bash
# Measures `replayd serve --streams-dev` on a SQLite file (defaults: fsync
# on) against the protocol's Node reference server (@durable-streams/server)
# file-backed and in memory, in one run: the three servers run side by side
# on free ports on 127.0.0.1, and the load generator (bench/, standard
# library only) runs each round of every phase on the three back to back,
# printing each figure and the ratios replayd/ref-file and replayd/ref-mem
# within the round. See bench/main.go for the phases.
#
#   bench.sh [BENCH FLAGS...]     e.g. bench.sh -rounds 3 -phases catchup
#
# Installs the locked npm dependencies like run.sh when node_modules is
# missing. BENCH_KEEP=DIR keeps the servers' files and logs in DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export PATH="$PATH:/usr/local/go/bin"
cd "$here"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  echo "== npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  touch node_modules
fi

tmp=${BENCH_KEEP:-$(mktemp -d)}
mkdir -p "$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${BENCH_KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

freeport() {
  node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}
waitfor() { # URL LOG PID: until URL answers at all (the reference answers / with 404)
  for _ in $(seq 1 300); do
    if curl -sS -o /dev/null "$1" 2>/dev/null; then return 0; fi
    if ! kill -0 "$3" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "bench.sh: a server did not start; its log:" >&2
  cat "$2" >&2
  exit 1
}

echo "== go build ./cmd/replayd ./interop/durable/bench"
(cd "$root" && go build -o "$tmp/replayd" ./cmd/replayd)
(cd "$root/interop" && go build -o "$tmp/bench" ./durable/bench)

p1=$(freeport)
"$tmp/replayd" serve --listen "127.0.0.1:$p1" --db "$tmp/replayd.db" --streams-dev \
  --log-level warn >"$tmp/replayd.log" 2>&1 &
pids+=($!)
waitfor "http://127.0.0.1:$p1/healthz" "$tmp/replayd.log" "${pids[-1]}"

p2=$(freeport)
mkdir -p "$tmp/ref-file"
node reference.mjs "$p2" "$tmp/ref-file" >"$tmp/ref-file.log" 2>&1 &
pids+=($!)
waitfor "http://127.0.0.1:$p2/" "$tmp/ref-file.log" "${pids[-1]}"

p3=$(freeport)
node reference.mjs "$p3" >"$tmp/ref-mem.log" 2>&1 &
pids+=($!)
waitfor "http://127.0.0.1:$p3/" "$tmp/ref-mem.log" "${pids[-1]}"

echo "== $(cd "$root" && git rev-parse --short HEAD) $(go version | cut -d' ' -f3) node $(node --version), $(nproc) cores"
"$tmp/bench" -target "replayd=http://127.0.0.1:$p1" \
  -target "ref-file=http://127.0.0.1:$p2" \
  -target "ref-mem=http://127.0.0.1:$p3" "$@"
