#!/usr/bin/env bash
# Runs the Durable Streams server conformance suite
# (@durable-streams/server-conformance-tests, pinned in package-lock.json)
# against a server. See README.md.
#
#   run.sh URL                  a server already listening at URL (its root:
#                               the suite adds /v1/stream/... itself)
#   run.sh --reference [DIR]    the protocol's Node reference server
#                               (@durable-streams/server), in memory, or
#                               file-backed in DIR, on a free port
#   run.sh --replayd            `replayd serve` built from this tree, on a
#                               fresh SQLite file, on a free port
#   run.sh --replayd-pg [DSN]   two `replayd serve --postgres DSN
#                               --streams-dev` nodes on a fresh table prefix
#                               (DSN: $REPLAYD_PG_DSN, as .ci/pg.sh exports
#                               it) behind rrproxy, which sends each request
#                               to the other node from the one before
#
# Anything after `--` goes to vitest (e.g. `-- -t "JSON Mode"`). Installs
# the locked dependencies with `npm ci` when node_modules is missing or
# older than package-lock.json. Prints the failed tests and, last,
# "conformance: N passed, N failed, N skipped"; exits with vitest's status
# (non-zero when a test failed). REPLAYD_SERVE_FLAGS adds flags to
# `replayd serve`; CONFORMANCE_REPORT=FILE keeps vitest's JSON report
# (every test's name and status) there. Everything listens on 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export PATH="$PATH:/usr/local/go/bin"

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
mode=$1; shift
refdir=
if [ "$mode" = --reference ] && [ $# -ge 1 ] && [ "$1" != -- ]; then refdir=$1; shift; fi
pgdsn=${REPLAYD_PG_DSN:-}
if [ "$mode" = --replayd-pg ] && [ $# -ge 1 ] && [ "$1" != -- ]; then pgdsn=$1; shift; fi
if [ $# -ge 1 ] && [ "$1" = -- ]; then shift; fi
case "$mode" in -h | --help) usage ;; esac

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is not installed" >&2; exit 1; }
done
cd "$here"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  echo "== npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  touch node_modules
fi

tmp=$(mktemp -d)
pid=
pids=() # every process started, pid among them
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

freeport() {
  node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# waitfor URL LOG: until URL answers, or fail showing the server's log.
waitfor() {
  for _ in $(seq 1 300); do
    if node -e 'fetch(process.argv[1]).then(()=>process.exit(0),()=>process.exit(1))' "$1" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "run.sh: the server did not start; its log:" >&2
  cat "$2" >&2
  exit 1
}

case "$mode" in
--reference)
  port=$(freeport)
  node reference.mjs "$port" ${refdir:+"$refdir"} >"$tmp/server.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  url="http://127.0.0.1:$port"
  waitfor "$url/" "$tmp/server.log"
  ;;
--replayd)
  echo "== go build ./cmd/replayd"
  (cd "$root" && go build -o "$tmp/replayd" ./cmd/replayd)
  port=$(freeport)
  # shellcheck disable=SC2086 # REPLAYD_SERVE_FLAGS is split on purpose
  "$tmp/replayd" serve --listen "127.0.0.1:$port" --db "$tmp/replayd.db" \
    ${REPLAYD_SERVE_FLAGS:-} >"$tmp/server.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  url="http://127.0.0.1:$port"
  waitfor "$url/healthz" "$tmp/server.log"
  ;;
--replayd-pg)
  [ -n "$pgdsn" ] || { echo "run.sh: --replayd-pg needs a DSN (or REPLAYD_PG_DSN: source .ci/pg.sh)" >&2; exit 2; }
  echo "== go build ./cmd/replayd ./durable/rrproxy"
  (cd "$root" && go build -o "$tmp/replayd" ./cmd/replayd)
  (cd "$root/interop" && go build -o "$tmp/rrproxy" ./durable/rrproxy)
  # A fresh prefix: the suite expects an empty log. Its tables stay (the
  # cluster .ci/pg.sh starts is thrown away).
  prefix="ds$(date +%s)_$$_"
  upstreams=()
  for n in 1 2; do
    port=$(freeport)
    # shellcheck disable=SC2086 # REPLAYD_SERVE_FLAGS is split on purpose
    "$tmp/replayd" serve --listen "127.0.0.1:$port" --postgres "$pgdsn" \
      --postgres-table-prefix "$prefix" --streams-dev \
      ${REPLAYD_SERVE_FLAGS:-} >"$tmp/node$n.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    waitfor "http://127.0.0.1:$port/healthz" "$tmp/node$n.log"
    upstreams+=("http://127.0.0.1:$port")
  done
  port=$(freeport)
  "$tmp/rrproxy" -listen "127.0.0.1:$port" "${upstreams[@]}" >"$tmp/proxy.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  url="http://127.0.0.1:$port"
  waitfor "$url/healthz" "$tmp/proxy.log"
  ;;
-*) usage ;;
*) url=$mode ;;
esac

echo "== conformance against $url"
status=0
CONFORMANCE_TEST_URL=$url npx vitest run --reporter=default \
  --reporter=json --outputFile="$tmp/report.json" "$@" || status=$?
if [ -s "$tmp/report.json" ]; then
  node summary.mjs "$tmp/report.json"
  if [ -n "${CONFORMANCE_REPORT:-}" ]; then cp "$tmp/report.json" "$CONFORMANCE_REPORT"; fi
else
  echo "run.sh: vitest wrote no report" >&2
  [ "$status" != 0 ] || status=1
fi
exit "$status"
