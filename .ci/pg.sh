# Sourced by .ci/run (bash). Starts a throwaway PostgreSQL cluster for the
# replaydpg tests and exports REPLAYD_PG_DSN; the cluster is stopped when the
# sourcing shell exits. Returns non-zero (and, under set -e, fails CI) when
# PostgreSQL cannot be installed or the cluster does not start.
#
# REPLAYD_PG_FSYNC=1 keeps fsync and synchronous_commit on (for durability
# tests and benchmarks); by default both are off, which is safe for a cluster
# that is deleted when the run ends and much faster on slow disks.
#
# REPLAYD_PG_FSYNC_CLUSTER=1 (.ci/run sets it) also starts a SECOND cluster,
# with fsync, synchronous_commit and full_page_writes on, for the crash test
# (replaydpg's TestCrashDurability), which crashes and restarts its server:
# a crash there cannot break the tests sharing the first cluster. It exports
#   REPLAYD_PG_FSYNC_DSN  its DSN
#   REPLAYD_PG_FSYNC_CTL  a control script: "crash" SIGKILLs the postmaster
#                         and every server process at once; "start" starts
#                         the cluster again (crash recovery) and waits until
#                         it accepts connections (nothing if it runs)
# Its settings live in its postgresql.conf, so a restart keeps them. It costs
# about 1.5 s more.
#
# REPLAYD_PG_PGBOUNCER=1 (.ci/run sets it) also installs PgBouncer if it is
# missing and starts one in front of the first cluster (unix socket only,
# a few milliseconds), exporting
#   REPLAYD_PG_BOUNCER_DSN          database "postgres", pool_mode=transaction
#   REPLAYD_PG_BOUNCER_SESSION_DSN  the same database, pool_mode=session

pg_bindir() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

# pg_install sets REPLAYD_PG_BIN, installing postgresql (and, with
# REPLAYD_PG_PGBOUNCER=1, pgbouncer) if it is missing.
pg_install() {
  local bin pkgs=
  bin=$(pg_bindir)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    pkgs=postgresql
  fi
  if [ "${REPLAYD_PG_PGBOUNCER:-}" = 1 ] && [ ! -x /usr/sbin/pgbouncer ]; then
    pkgs="$pkgs pgbouncer"
  fi
  if [ -n "$pkgs" ]; then
    echo "== installing $pkgs"
    export DEBIAN_FRONTEND=noninteractive
    local try
    for try in 1 2 3; do
      if apt-get install -y -qq $pkgs >/dev/null ||
        { apt-get update -qq && apt-get install -y -qq $pkgs >/dev/null; }; then
        break
      fi
      [ "$try" = 3 ] && { echo "pg.sh: cannot install $pkgs" >&2; return 1; }
      echo "apt failed; retrying"; sleep 10
    done
    bin=$(pg_bindir)
  fi
  [ -x "$bin/initdb" ] || { echo "pg.sh: no initdb under /usr/lib/postgresql" >&2; return 1; }
  REPLAYD_PG_BIN=$bin
}

# pg_initdb DIR: a cluster in DIR/data, its socket to be in DIR.
pg_initdb() {
  local dir=$1 bin=$REPLAYD_PG_BIN
  # initdb and postgres refuse to run as root: the cluster belongs to the
  # postgres user, in a directory that also holds the unix socket.
  chown postgres:postgres "$dir" || return 1
  runuser -u postgres -- "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; echo "pg.sh: initdb failed" >&2; return 1; }
}

# pg_up DIR OPTS: start the cluster in DIR with the postgres options OPTS;
# prove it answers.
pg_up() {
  local dir=$1 opts=$2 bin=$REPLAYD_PG_BIN
  runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null ||
    { cat "$dir/server.log" >&2; echo "pg.sh: the cluster in $dir did not start" >&2; return 1; }
  # Prove it answers, so a broken cluster fails here and not as skipped tests.
  runuser -u postgres -- "$bin/psql" -h "$dir" -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null ||
    { echo "pg.sh: the cluster in $dir does not answer" >&2; return 1; }
}

pg_start() {
  local dir opts
  pg_install || return 1
  dir=$(mktemp -d /tmp/replayd-pg.XXXXXX) || return 1
  REPLAYD_PG_DIR=$dir
  trap 'pg_stop' EXIT
  opts="-k $dir -c listen_addresses=''"
  if [ "${REPLAYD_PG_FSYNC:-}" != 1 ]; then
    opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  fi
  pg_initdb "$dir" && pg_up "$dir" "$opts" || return 1
  export REPLAYD_PG_DSN="host=$dir user=postgres dbname=postgres"
  echo "== postgresql $("$REPLAYD_PG_BIN/postgres" --version | awk '{print $3}') at $dir"
  if [ "${REPLAYD_PG_FSYNC_CLUSTER:-}" = 1 ]; then
    pg_start_fsync || return 1
  fi
  if [ "${REPLAYD_PG_PGBOUNCER:-}" = 1 ]; then
    pg_start_bouncer || return 1
  fi
}

# pg_start_bouncer starts PgBouncer in front of the first cluster.
pg_start_bouncer() {
  local dir=$REPLAYD_PG_DIR/bouncer
  mkdir -p "$dir" && chown postgres:postgres "$dir" || return 1
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
postgres = host=$REPLAYD_PG_DIR dbname=postgres user=postgres
postgres_session = host=$REPLAYD_PG_DIR dbname=postgres user=postgres pool_mode=session
[pgbouncer]
listen_addr =
listen_port = 6432
unix_socket_dir = $dir
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  # PgBouncer refuses to run as root, like postgres.
  runuser -u postgres -- /usr/sbin/pgbouncer -d "$dir/pgbouncer.ini" ||
    { cat "$dir/pgbouncer.log" >&2; echo "pg.sh: pgbouncer did not start" >&2; return 1; }
  runuser -u postgres -- "$REPLAYD_PG_BIN/psql" -h "$dir" -p 6432 -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null ||
    { cat "$dir/pgbouncer.log" >&2; echo "pg.sh: pgbouncer does not answer" >&2; return 1; }
  export REPLAYD_PG_BOUNCER_DSN="host=$dir port=6432 user=postgres dbname=postgres"
  export REPLAYD_PG_BOUNCER_SESSION_DSN="host=$dir port=6432 user=postgres dbname=postgres_session"
  echo "== $(/usr/sbin/pgbouncer --version | head -n 1) at $dir (transaction and session pooling)"
}

# pg_start_fsync starts the second cluster, the one the crash test crashes.
pg_start_fsync() {
  local dir bin=$REPLAYD_PG_BIN
  dir=$(mktemp -d /tmp/replayd-pgfsync.XXXXXX) || return 1
  REPLAYD_PG_FSYNC_DIR=$dir
  # The control script first, so that pg_stop finds the cluster even if
  # the start fails half-way.
  cat >"$dir/ctl" <<EOF
#!/usr/bin/env bash
# Written by .ci/pg.sh: crash | start | stop the cluster in $dir.
set -u
data=$dir/data
as_postgres() { if [ "\$(id -u)" = 0 ]; then runuser -u postgres -- "\$@"; else "\$@"; fi; }
case "\${1:-}" in
crash)
  # SIGKILL the postmaster and all its children at once: no shutdown
  # checkpoint, no flush; the next start runs crash recovery from the WAL.
  pm=\$(head -n 1 "\$data/postmaster.pid" 2>/dev/null) || { echo "ctl: no postmaster.pid" >&2; exit 1; }
  # Its children, from /proc (no procps needed): "pid (comm) state ppid ...".
  kids=\$(awk -v pm="\$pm" '\$4 == pm {print \$1}' /proc/[0-9]*/stat 2>/dev/null)
  # A child that ended meanwhile is no error; the loop below checks.
  kill -KILL "\$pm" \$kids 2>/dev/null
  for i in \$(seq 1 200); do
    alive=
    for p in \$pm \$kids; do
      # A zombie (state Z) is dead; only its parent can reap it.
      if [ -r /proc/\$p/stat ] && [ "\$(awk '{print \$3}' /proc/\$p/stat 2>/dev/null)" != Z ]; then alive=1; fi
    done
    if [ -z "\$alive" ]; then
      # The lock files are stale now, but where PID 1 reaps no orphans
      # (some containers) the dead postmaster stays a zombie, which the
      # next postmaster takes for a live one: remove them, as after a power
      # cut they would name no process at all.
      rm -f "\$data/postmaster.pid" "$dir"/.s.PGSQL.*.lock
      exit 0
    fi
    sleep 0.05
  done
  echo "ctl: server processes still alive after SIGKILL" >&2; exit 1 ;;
start)
  as_postgres "$bin/pg_ctl" -D "\$data" status >/dev/null 2>&1 && exit 0 # running already
  as_postgres "$bin/pg_ctl" -D "\$data" -l "$dir/server.log" -w -t 60 start >/dev/null ||
    { tail -n 20 "$dir/server.log" >&2; exit 1; } ;;
stop)
  as_postgres "$bin/pg_ctl" -D "\$data" -m immediate stop >/dev/null 2>&1 || true ;;
*)
  echo "usage: \$0 crash|start|stop" >&2; exit 2 ;;
esac
EOF
  chmod 755 "$dir/ctl"
  pg_initdb "$dir" || return 1
  # The settings go into postgresql.conf, so the test's restarts (pg_ctl
  # start without -o) keep them.
  printf "%s\n" "unix_socket_directories = '$dir'" "listen_addresses = ''" \
    "fsync = on" "synchronous_commit = on" "full_page_writes = on" >>"$dir/data/postgresql.conf" || return 1
  pg_up "$dir" "" || return 1
  export REPLAYD_PG_FSYNC_DSN="host=$dir user=postgres dbname=postgres"
  export REPLAYD_PG_FSYNC_CTL="$dir/ctl"
  echo "== postgresql (fsync on, for the crash test) at $dir"
}

pg_stop() {
  if [ -n "${REPLAYD_PG_DIR:-}" ] && [ -f "$REPLAYD_PG_DIR/bouncer/pgbouncer.pid" ]; then
    kill "$(cat "$REPLAYD_PG_DIR/bouncer/pgbouncer.pid")" 2>/dev/null || true
  fi
  if [ -n "${REPLAYD_PG_FSYNC_DIR:-}" ] && [ -d "$REPLAYD_PG_FSYNC_DIR" ]; then
    [ -x "$REPLAYD_PG_FSYNC_DIR/ctl" ] && "$REPLAYD_PG_FSYNC_DIR/ctl" stop
    rm -rf "$REPLAYD_PG_FSYNC_DIR"
  fi
  if [ -n "${REPLAYD_PG_DIR:-}" ] && [ -d "$REPLAYD_PG_DIR/data" ]; then
    runuser -u postgres -- "$REPLAYD_PG_BIN/pg_ctl" -D "$REPLAYD_PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$REPLAYD_PG_DIR"
  fi
}

pg_start
