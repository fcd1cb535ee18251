# Sourced by .ci/run (bash). Starts a throwaway PostgreSQL cluster for the
# replaydpg tests and exports REPLAYD_PG_DSN; the cluster is stopped when the
# sourcing shell exits. Returns non-zero (and, under set -e, fails CI) when
# PostgreSQL cannot be installed or the cluster does not start.
#
# REPLAYD_PG_FSYNC=1 keeps fsync and synchronous_commit on (for durability
# tests and benchmarks); by default both are off, which is safe for a cluster
# that is deleted when the run ends and much faster on slow disks.

pg_bindir() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

pg_start() {
  local bin dir opts
  bin=$(pg_bindir)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    echo "== installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    local try
    for try in 1 2 3; do
      if apt-get install -y -qq postgresql >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }; then
        break
      fi
      [ "$try" = 3 ] && { echo "pg.sh: cannot install postgresql" >&2; return 1; }
      echo "apt failed; retrying"; sleep 10
    done
    bin=$(pg_bindir)
  fi
  [ -x "$bin/initdb" ] || { echo "pg.sh: no initdb under /usr/lib/postgresql" >&2; return 1; }

  # initdb and postgres refuse to run as root: the cluster belongs to the
  # postgres user, in a directory that also holds the unix socket.
  dir=$(mktemp -d /tmp/replayd-pg.XXXXXX) || return 1
  chown postgres:postgres "$dir" || return 1
  runuser -u postgres -- "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; echo "pg.sh: initdb failed" >&2; return 1; }
  opts="-k $dir -c listen_addresses=''"
  if [ "${REPLAYD_PG_FSYNC:-}" != 1 ]; then
    opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  fi
  REPLAYD_PG_DIR=$dir
  REPLAYD_PG_BIN=$bin
  trap 'pg_stop' EXIT
  runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null ||
    { cat "$dir/server.log" >&2; echo "pg.sh: the cluster did not start" >&2; return 1; }
  export REPLAYD_PG_DSN="host=$dir user=postgres dbname=postgres"
  # Prove it answers, so a broken cluster fails here and not as skipped tests.
  runuser -u postgres -- "$bin/psql" -h "$dir" -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null ||
    { echo "pg.sh: the cluster does not answer" >&2; return 1; }
  echo "== postgresql $("$bin/postgres" --version | awk '{print $3}') at $dir"
}

pg_stop() {
  if [ -n "${REPLAYD_PG_DIR:-}" ] && [ -d "$REPLAYD_PG_DIR/data" ]; then
    runuser -u postgres -- "$REPLAYD_PG_BIN/pg_ctl" -D "$REPLAYD_PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$REPLAYD_PG_DIR"
  fi
}

pg_start
