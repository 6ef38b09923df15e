#!/usr/bin/env bash
# Bootstrap the local development / test environment for NovelForge Session Runtime.
#
# Usage: scripts/bootstrap.sh MODE
#   MODE = run   venv + compiled translations (gettext) + PostgreSQL + database
#   MODE = test  the above + Redis + Chromium (for browser tests), nginx and Prometheus (best effort)
#   MODE = stop  stop the project-local PostgreSQL / Redis this script may have started
#
# Contract: every log line goes to stderr. stdout carries only `export NAME=value`
# lines (shell-quoted), meant for  `exports="$(scripts/bootstrap.sh test)" && eval "$exports"`.
# The same lines are written to .env.bootstrap so a shell can `. ./.env.bootstrap`.
#
# Respected environment:
#   DATABASE_URL      use this server/database as is (the database is created if missing)
#   REDIS_URL / TEST_REDIS_URL   (test mode) use this Redis as is
#   FORCE_LOCAL_PG=1     ignore DATABASE_URL and 127.0.0.1:5432; use the project-local cluster
#   FORCE_LOCAL_REDIS=1  ignore REDIS_URL/TEST_REDIS_URL and 127.0.0.1:6379; use the local Redis
#   LOCAL_PG_PORT (54329), LOCAL_REDIS_PORT (63799), LOCAL_DB_NAME (novelforge)
#   LOCAL_PG_DIR      where the project-local cluster lives (default: .pgdata/, or a per-project
#                     directory under /tmp when the postgres user cannot reach the checkout)
#   LOCAL_REDIS_DIR   where the project-local Redis keeps its pid and log files (default: .redis/)
#   BOOTSTRAP_ENV_FILE   where the export lines are also written (default: .env.bootstrap)
#   BOOTSTRAP_PYTHON  use this interpreter as is: no .venv is created or installed into (CI, tests)
#   PYTHON            interpreter used to create .venv (default: python3.11, else python3)
set -euo pipefail

# Keep the real stdout on fd 3 for the export lines; everything else goes to stderr.
exec 3>&1 1>&2

MODE="${1:-}"
case "$MODE" in
  run|test|stop) ;;
  *) echo "usage: $0 run|test|stop" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.bootstrap-pyproject.sha256"
LOCAL_PG_PORT="${LOCAL_PG_PORT:-54329}"
LOCAL_REDIS_PORT="${LOCAL_REDIS_PORT:-63799}"
LOCAL_DB_NAME="${LOCAL_DB_NAME:-novelforge}"
REDIS_DIR="${LOCAL_REDIS_DIR:-$ROOT/.redis}"
ENV_FILE="${BOOTSTRAP_ENV_FILE:-$ROOT/.env.bootstrap}"
[ -n "${BOOTSTRAP_PYTHON:-}" ] && VPY="$BOOTSTRAP_PYTHON"

log() { printf '[bootstrap] %s\n' "$*" >&2; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

IS_ROOT=0
[ "$(id -u)" -eq 0 ] && IS_ROOT=1

# Run a command as root (directly, or via passwordless sudo).
as_root() {
  if [ "$IS_ROOT" -eq 1 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo -n "$@"
  else die "need root to run: $*"
  fi
}

APT_UPDATED=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not available; please install: $*"
  if [ "$APT_UPDATED" -eq 0 ]; then
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    APT_UPDATED=1
  fi
  log "apt-get install -y $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# tcp_open HOST PORT: true when something accepts TCP connections there.
tcp_open() {
  timeout 2 bash -c "exec 9<>/dev/tcp/$1/$2" 2>/dev/null
}

# redis_ping HOST PORT: true when a Redis server answers PING with +PONG.
redis_ping() {
  timeout 3 bash -c '
    exec 9<>"/dev/tcp/$1/$2" || exit 1
    printf "PING\r\n" >&9
    IFS= read -r line <&9 || exit 1
    [[ $line == +PONG* ]]' _ "$1" "$2" 2>/dev/null
}

# ---------------------------------------------------------------- PostgreSQL helpers
find_pg_bin() {
  local d
  # newest major version first
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -rn); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  return 1
}

# Where the project-local cluster lives. Normally $ROOT/.pgdata; when running as root and the
# postgres user cannot reach the project directory, a per-project directory under /tmp.
PG_BASE=""
pg_base_candidates() {
  if [ -n "${LOCAL_PG_DIR:-}" ]; then echo "$LOCAL_PG_DIR"; return 0; fi
  echo "$ROOT/.pgdata"
  echo "/tmp/novelforge-pg-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
}

# Run a PostgreSQL server binary as the right user (postgres refuses to run as root).
pg_as_owner() {
  if [ "$IS_ROOT" -eq 1 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    (cd / && "$@")
  fi
}

local_pg_running() {  # $1 = base dir; prints the port when running
  local base="$1" bin
  [ -f "$base/data/postmaster.pid" ] || return 1
  bin="$(find_pg_bin)" || return 1
  pg_as_owner "$bin/pg_ctl" -D "$base/data" status >/dev/null 2>&1 || return 1
  sed -n '4p' "$base/data/postmaster.pid"
}

start_local_pg() {
  local bin base sockdir locale_opt port
  if ! bin="$(find_pg_bin)"; then
    apt_install postgresql
    bin="$(find_pg_bin)" || die "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin after install"
  fi
  if [ "$IS_ROOT" -eq 1 ]; then
    getent passwd postgres >/dev/null || die "running as root but there is no 'postgres' user to run the server"
  fi

  # Reuse a cluster that is already running from an earlier bootstrap.
  for base in $(pg_base_candidates); do
    if port="$(local_pg_running "$base")"; then
      log "project-local PostgreSQL already running ($base, port $port)"
      PG_BASE="$base"; PG_PORT="$port"; return 0
    fi
  done

  # Pick the base directory: an existing initialised one, else the first usable candidate.
  PG_BASE=""
  for base in $(pg_base_candidates); do
    if [ -f "$base/data/PG_VERSION" ]; then PG_BASE="$base"; break; fi
  done
  if [ -z "$PG_BASE" ]; then
    for base in $(pg_base_candidates); do
      mkdir -p "$base"
      chmod 700 "$base"
      if [ "$IS_ROOT" -eq 1 ]; then
        chown postgres:postgres "$base"
        if ! runuser -u postgres -- test -w "$base" 2>/dev/null; then
          log "postgres user cannot reach $base; trying another location"
          rmdir "$base" 2>/dev/null || true
          continue
        fi
      fi
      PG_BASE="$base"; break
    done
    [ -n "$PG_BASE" ] || die "no directory usable for a local PostgreSQL cluster"
  fi

  if [ ! -f "$PG_BASE/data/PG_VERSION" ]; then
    if locale -a 2>/dev/null | grep -qix 'c.utf-\?8'; then locale_opt="--locale=C.UTF-8"; else locale_opt="--no-locale"; fi
    log "initdb $PG_BASE/data ($("$bin/postgres" --version))"
    pg_as_owner "$bin/initdb" -D "$PG_BASE/data" --auth=trust -U postgres --encoding=UTF8 "$locale_opt" >/dev/null
  fi

  if tcp_open 127.0.0.1 "$LOCAL_PG_PORT"; then
    die "port $LOCAL_PG_PORT is taken by something else; set LOCAL_PG_PORT to a free port"
  fi
  # Unix socket path must stay under ~107 bytes.
  sockdir="$PG_BASE"
  [ "${#sockdir}" -lt 90 ] || sockdir="/tmp"
  log "starting project-local PostgreSQL on 127.0.0.1:$LOCAL_PG_PORT ($PG_BASE)"
  # The server outlives this script: it must not inherit fd 3 (the caller's `$(…)` pipe, which
  # would then never see end of input) nor any other descriptor of ours (see daemon_fds).
  pg_as_owner "$bin/pg_ctl" -D "$PG_BASE/data" -l "$PG_BASE/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $LOCAL_PG_PORT -k $sockdir" start </dev/null >/dev/null 3>&- \
    || { tail -n 20 "$PG_BASE/postgres.log" >&2 || true; die "could not start local PostgreSQL"; }
  PG_PORT="$LOCAL_PG_PORT"
}

stop_local_pg() {
  local base bin
  bin="$(find_pg_bin)" || { log "no PostgreSQL binaries; nothing to stop"; return 0; }
  for base in $(pg_base_candidates); do
    if local_pg_running "$base" >/dev/null; then
      log "stopping project-local PostgreSQL ($base)"
      pg_as_owner "$bin/pg_ctl" -D "$base/data" -m fast -w stop >/dev/null
    fi
  done
}

# Python snippets run with the venv interpreter (psycopg comes with the project's dependencies).
pg_server_ok() {  # $1 = conninfo/URL; true when we can log in
  "$VPY" - "$1" <<'PY' 2>/dev/null
import sys, psycopg
try:
    psycopg.connect(sys.argv[1], connect_timeout=3).close()
except Exception:
    sys.exit(1)
PY
}

ensure_database() {  # $1 = DATABASE_URL
  "$VPY" - "$1" <<'PY'
import sys
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

url = sys.argv[1]
try:
    params = conninfo_to_dict(url)
except Exception as exc:
    sys.exit(f"[bootstrap] ERROR: cannot parse DATABASE_URL: {exc}")
dbname = params.get("dbname")
if not dbname:
    sys.exit("[bootstrap] ERROR: DATABASE_URL names no database")
try:
    conn = psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True, connect_timeout=5)
except Exception as exc:
    sys.exit(f"[bootstrap] ERROR: cannot connect to the server in DATABASE_URL "
             f"(maintenance db 'postgres'): {exc}")
with conn:
    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
    if exists:
        print(f"[bootstrap] database {dbname!r} exists", file=sys.stderr)
    else:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        print(f"[bootstrap] created database {dbname!r}", file=sys.stderr)
PY
}

# ---------------------------------------------------------------- Redis helpers
stop_local_redis() {
  if [ -f "$REDIS_DIR/redis.pid" ] && kill -0 "$(cat "$REDIS_DIR/redis.pid")" 2>/dev/null; then
    log "stopping project-local Redis (pid $(cat "$REDIS_DIR/redis.pid"))"
    kill "$(cat "$REDIS_DIR/redis.pid")"
    for _ in $(seq 1 50); do
      kill -0 "$(cat "$REDIS_DIR/redis.pid" 2>/dev/null)" 2>/dev/null || break
      sleep 0.1
    done
  fi
}

start_local_redis() {
  if redis_ping 127.0.0.1 "$LOCAL_REDIS_PORT"; then
    log "project-local Redis already running on 127.0.0.1:$LOCAL_REDIS_PORT"
    return 0
  fi
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  command -v redis-server >/dev/null 2>&1 || die "redis-server not found after install"
  tcp_open 127.0.0.1 "$LOCAL_REDIS_PORT" \
    && die "port $LOCAL_REDIS_PORT is taken by something that is not Redis; set LOCAL_REDIS_PORT"
  mkdir -p "$REDIS_DIR"
  log "starting project-local Redis on 127.0.0.1:$LOCAL_REDIS_PORT"
  # As PostgreSQL: the daemon must not hold the caller's `$(…)` pipe (fd 3) open.
  redis-server --daemonize yes --bind 127.0.0.1 --port "$LOCAL_REDIS_PORT" --save "" --appendonly no \
    --dir "$REDIS_DIR" --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" </dev/null >/dev/null 3>&-
  for _ in $(seq 1 50); do
    redis_ping 127.0.0.1 "$LOCAL_REDIS_PORT" && return 0
    sleep 0.1
  done
  tail -n 20 "$REDIS_DIR/redis.log" >&2 || true
  die "local Redis did not answer PING on port $LOCAL_REDIS_PORT"
}

# ================================================================ main
if [ "$MODE" = stop ]; then
  stop_local_pg
  stop_local_redis
  exit 0
fi

# ---- 1. virtualenv
if [ -n "${BOOTSTRAP_PYTHON:-}" ]; then
  log "BOOTSTRAP_PYTHON=$BOOTSTRAP_PYTHON: using it as is (no .venv)"
else
if [ -e "$VENV" ] && ! "$VPY" -c 'import sys' >/dev/null 2>&1; then
  log ".venv exists but its python does not run; recreating it"
  rm -rf "$VENV"
fi
if [ ! -x "$VPY" ]; then
  PY_CREATE="${PYTHON:-}"
  if [ -z "$PY_CREATE" ]; then
    if command -v python3.11 >/dev/null 2>&1; then PY_CREATE=python3.11; else PY_CREATE=python3; fi
  fi
  command -v "$PY_CREATE" >/dev/null 2>&1 || die "$PY_CREATE not found"
  log "creating .venv with $PY_CREATE ($("$PY_CREATE" --version 2>&1))"
  "$PY_CREATE" -m venv "$VENV"
  rm -f "$STAMP"
fi
want_sha="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have_sha="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want_sha" != "$have_sha" ]; then
  log "installing the project into .venv (pip install -e '.[dev,otel]')"
  "$VPY" -m pip install --disable-pip-version-check -q -e '.[dev,otel]'
  printf '%s\n' "$want_sha" > "$STAMP"
else
  log ".venv up to date"
fi
fi  # BOOTSTRAP_PYTHON

# ---- 1b. the pages' translations (docs/pages.md#language): the catalogs in locale/ are compiled
# here (GNU gettext's msgfmt, through Django's compilemessages; only what changed). The compiled
# .mo files are never committed. `--ignore '*'` keeps it to the project's locale/ (not the venv's).
if ! command -v msgfmt >/dev/null 2>&1; then
  apt_install gettext
  command -v msgfmt >/dev/null 2>&1 || die "msgfmt not found after installing gettext"
fi
log "compiling the translation catalogs (locale/)"
"$VPY" manage.py compilemessages --ignore '*' -v 0

# ---- 2. PostgreSQL
if [ "${FORCE_LOCAL_PG:-0}" = 1 ]; then
  log "FORCE_LOCAL_PG=1: using the project-local cluster"
  start_local_pg
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$LOCAL_DB_NAME"
elif [ -n "${DATABASE_URL:-}" ]; then
  log "using DATABASE_URL from the environment"
elif pg_server_ok "host=127.0.0.1 port=5432 user=postgres dbname=postgres"; then
  log "PostgreSQL answers on 127.0.0.1:5432"
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$LOCAL_DB_NAME"
else
  log "no usable PostgreSQL on 127.0.0.1:5432"
  start_local_pg
  DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$LOCAL_DB_NAME"
fi
ensure_database "$DATABASE_URL"
EXPORTS=(DATABASE_URL)

# ---- 3. test-only services
if [ "$MODE" = test ]; then
  if [ "${FORCE_LOCAL_REDIS:-0}" = 1 ]; then
    log "FORCE_LOCAL_REDIS=1: using the project-local Redis"
    unset REDIS_URL
    start_local_redis
    TEST_REDIS_URL="redis://127.0.0.1:$LOCAL_REDIS_PORT/0"
  elif [ -n "${TEST_REDIS_URL:-}" ] || [ -n "${REDIS_URL:-}" ]; then
    log "using REDIS_URL/TEST_REDIS_URL from the environment"
  elif redis_ping 127.0.0.1 6379; then
    log "Redis answers on 127.0.0.1:6379 (tests use db 15)"
    TEST_REDIS_URL="redis://127.0.0.1:6379/15"
  else
    log "no Redis on 127.0.0.1:6379"
    start_local_redis
    TEST_REDIS_URL="redis://127.0.0.1:$LOCAL_REDIS_PORT/0"
  fi
  [ -n "${TEST_REDIS_URL:-}" ] && EXPORTS+=(TEST_REDIS_URL)
  [ -n "${REDIS_URL:-}" ] && EXPORTS+=(REDIS_URL)

  if [ ! -x /usr/bin/chromium ]; then
    apt_install chromium
    [ -x /usr/bin/chromium ] || die "/usr/bin/chromium missing after install"
  fi

  # nginx for the deployment test (tests/live/test_nginx.py runs deploy/nginx.conf in front of two
  # server processes). Only the binary is used: the packaged service is not needed, so its
  # maintainer scripts get no inherited descriptors (fd 3 is our stdout) and RUNLEVEL=1 keeps
  # invoke-rc.d from starting it. Best effort: without it that test says it was skipped.
  if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    RUNLEVEL=1 apt_install nginx </dev/null 3>&- || log "nginx could not be installed; the nginx test will be skipped"
  fi

  # Prometheus for the metrics test (tests/live/test_prometheus.py: a real Prometheus scrapes
  # /metrics of two server processes; promtool checks deploy/prometheus-alerts.yml). As nginx:
  # only the binaries are used, the packaged service is never started. Best effort: without
  # it those tests say they were skipped.
  if ! command -v prometheus >/dev/null 2>&1 && [ ! -x /usr/bin/prometheus ]; then
    RUNLEVEL=1 apt_install prometheus </dev/null 3>&- || log "prometheus could not be installed; the Prometheus tests will be skipped"
  fi
fi

# ---- 4. emit exports
out=""
for name in "${EXPORTS[@]}"; do
  out+="$(printf 'export %s=%q' "$name" "${!name}")"$'\n'
done
printf '# written by scripts/bootstrap.sh %s\n%s' "$MODE" "$out" > "$ENV_FILE"
printf '%s' "$out" >&3
log "ready ($MODE): ${EXPORTS[*]}"
