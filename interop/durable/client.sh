#!/usr/bin/env bash
# Runs client.test.mjs: the protocol's official TypeScript client,
# @durable-streams/client (pinned in package-lock.json), writing to and
# reading from `replayd serve --streams-dev` built from this tree, a server
# restart mid-read included. See README.md.
#
#   client.sh            one node on a fresh SQLite file
#   client.sh --pg [DSN] two `replayd serve --postgres` nodes on a fresh
#                        table prefix behind rrproxy (DSN: $REPLAYD_PG_DSN,
#                        as .ci/pg.sh exports it)
#
# Anything after `--` goes to node --test (e.g. `-- --test-name-pattern
# restart`). Installs the locked dependencies with `npm ci` when
# node_modules is missing or older than package-lock.json. Exits non-zero
# when a test fails, and when node, npm or (with --pg) the DSN is missing:
# nothing is skipped. Everything listens on 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export PATH="$PATH:/usr/local/go/bin"

pg=
dsn=${REPLAYD_PG_DSN:-}
if [ $# -ge 1 ] && [ "$1" = --pg ]; then
  pg=1; shift
  if [ $# -ge 1 ] && [ "$1" != -- ]; then dsn=$1; shift; fi
  [ -n "$dsn" ] || { echo "client.sh: --pg needs a DSN (or REPLAYD_PG_DSN: source .ci/pg.sh)" >&2; exit 2; }
fi
if [ $# -ge 1 ] && [ "$1" = -- ]; then shift; fi
if [ $# -ge 1 ] && [ "${1:0:2}" != -- ]; then sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi

for tool in node npm go; do
  command -v "$tool" >/dev/null || { echo "client.sh: $tool is not installed" >&2; exit 1; }
done
cd "$here"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  echo "== npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  touch node_modules
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== go build ./cmd/replayd${pg:+ ./durable/rrproxy}"
(cd "$root" && go build -o "$tmp/replayd" ./cmd/replayd)
export REPLAYD_BIN="$tmp/replayd"
if [ -n "$pg" ]; then
  (cd "$root/interop" && go build -o "$tmp/rrproxy" ./durable/rrproxy)
  export RRPROXY_BIN="$tmp/rrproxy" CLIENT_TEST_PG_DSN="$dsn"
fi

echo "== @durable-streams/client $(node -p 'require("./node_modules/@durable-streams/client/package.json").version') against replayd${pg:+ on PostgreSQL behind rrproxy}"
node --test --test-reporter=spec "$@" client.test.mjs
