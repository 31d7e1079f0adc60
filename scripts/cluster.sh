#!/usr/bin/env bash
# `make cluster`: N identical phone replicas behind nginx on :3000, all on this
# machine, sharing the private PostgreSQL of scripts/pg.sh.
#
#   scripts/cluster.sh start    build (release), start Postgres if needed, the
#                               replicas on 127.0.0.1:3101.., then nginx on :3000
#   scripts/cluster.sh stop     stop exactly the processes `start` recorded
#   scripts/cluster.sh status   what is recorded, what is alive, what is healthy
#
# Environment:
#   CLUSTER_REPLICAS    number of replicas (default 3)
#   CLUSTER_BASE_PORT   port of the first replica (default 3101)
#   PHONE_BIN           use this binary instead of building target/release/phone
#   DATABASE_URL        use this database instead of the private one
#   PHONE_PG_PORT       port of the private PostgreSQL (default 25429, as make run)
#   PHONE_* / RUST_LOG  passed through to every replica unchanged, except
#                       PORT and PHONE_BIND (set per replica) and
#                       PHONE_TRUST_FORWARDED_FOR (default true: behind nginx)
#
# Everything lives in data/cluster/: the state file (what was started, with
# PIDs), replica logs, and nginx's prefix (nginx/: config link, generated
# upstream list, pid, temp folders) and its logs. nginx runs as a private
# instance (its own prefix, pid and logs), never the system service. The
# balancer's configuration is deploy/nginx.conf itself, linked, not copied:
# the same file docker compose mounts.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

DIR="$ROOT/data/cluster"
STATE="$DIR/state"
NGINX_PREFIX="$DIR/nginx"
LB_PORT=3000                       # fixed by `listen 3000` in deploy/nginx.conf
REPLICAS=${CLUSTER_REPLICAS:-3}
BASE_PORT=${CLUSTER_BASE_PORT:-3101}
PG_PORT=${PHONE_PG_PORT:-25429}

log() { echo "cluster: $*"; }
die() { echo "cluster: $*" >&2; exit 1; }

# A process is ours and alive: it exists, is not a zombie, and its command line
# still contains what we started it with (guards against PID reuse).
alive() {
    local pid=$1 marker=$2 stat
    [ -r "/proc/$pid/stat" ] || return 1
    stat=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$stat" != Z ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$marker"
}

port_busy() {
    # bash's /dev/tcp: a successful connect means something already listens.
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

http_ok() {
    curl -fsS --max-time 2 -o /dev/null "$1" 2>/dev/null
}

# Wait (bounded) until a URL answers 200, while the process stays alive.
wait_healthy() {
    local url=$1 pid=$2 marker=$3 seconds=$4 i
    for ((i = 0; i < seconds * 4; i++)); do
        http_ok "$url" && return 0
        alive "$pid" "$marker" || return 1
        sleep 0.25
    done
    return 1
}

# Lines of the state file: KIND NAME PID PORT MARKER
#   replica 1 12345 3101 /path/to/phone
#   nginx lb 12350 3000 /path/to/data/cluster/nginx/
#   postgres pg - 25429 data/pg        (only when this script started it)
record() { echo "$*" >>"$STATE"; }

stop_group() {
    # Each process was started with setsid: it leads its own process group,
    # which holds it and its children (nginx workers) and nothing else.
    local kind=$1 name=$2 pid=$3 marker=$4 i
    if ! alive "$pid" "$marker"; then
        # The leader is gone; nginx workers could outlive a killed master.
        if kill -0 -- "-$pid" 2>/dev/null; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
        log "$kind $name (pid $pid) was not running"
        return 0
    fi
    # phone: SIGTERM = graceful (finishes requests in flight, up to
    # PHONE_SHUTDOWN_GRACE_SECS). nginx: SIGQUIT = graceful shutdown.
    if [ "$kind" = nginx ]; then kill -QUIT "$pid"; else kill -TERM "$pid"; fi
    for ((i = 0; i < 120; i++)); do   # 30 s
        alive "$pid" "$marker" || break
        sleep 0.25
    done
    if alive "$pid" "$marker"; then
        log "$kind $name (pid $pid) did not stop in 30 s; killing its process group"
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    # Leftover children (none expected), then report.
    if kill -0 -- "-$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
    log "stopped $kind $name (pid $pid)"
}

cmd_stop() {
    if [ ! -f "$STATE" ]; then
        log "nothing recorded in data/cluster/state; nothing to stop"
        return 0
    fi
    local kind name pid port marker
    # nginx first (stop sending traffic), then the replicas, then Postgres if
    # this script started it.
    while read -r kind name pid port marker; do
        if [ "$kind" = nginx ]; then stop_group "$kind" "$name" "$pid" "$marker"; fi
    done <"$STATE"
    while read -r kind name pid port marker; do
        if [ "$kind" = replica ]; then stop_group "$kind" "$name" "$pid" "$marker"; fi
    done <"$STATE"
    while read -r kind name pid port marker; do
        if [ "$kind" = postgres ]; then
            scripts/pg.sh stop "$marker"
            log "stopped the PostgreSQL in $marker that cluster start had started"
        fi
    done <"$STATE"
    rm -f "$STATE"
}

cmd_status() {
    if [ ! -f "$STATE" ]; then
        log "not running (no data/cluster/state)"
        return 1
    fi
    local kind name pid port marker up=0 total=0 health
    while read -r kind name pid port marker; do
        case "$kind" in
        replica)
            total=$((total + 1))
            if alive "$pid" "$marker"; then
                health=$(curl -s --max-time 2 "http://127.0.0.1:$port/health" || echo "no answer")
                up=$((up + 1))
                printf '  replica %-3s pid %-7s http://127.0.0.1:%s  /health: %s\n' "$name" "$pid" "$port" "$health"
            else
                printf '  replica %-3s pid %-7s http://127.0.0.1:%s  NOT RUNNING\n' "$name" "$pid" "$port"
            fi
            ;;
        nginx)
            if alive "$pid" "$marker"; then
                health=$(curl -s --max-time 2 "http://127.0.0.1:$port/health" || echo "no answer")
                printf '  nginx       pid %-7s http://127.0.0.1:%s  /health via a replica: %s\n' "$pid" "$port" "$health"
            else
                printf '  nginx       pid %-7s http://127.0.0.1:%s  NOT RUNNING\n' "$pid" "$port"
            fi
            ;;
        postgres)
            printf '  postgres    (started by cluster) %s on port %s\n' "$marker" "$port"
            ;;
        esac
    done <"$STATE"
    log "$up of $total replicas running"
}

cmd_start() {
    if ! [[ "$REPLICAS" =~ ^[0-9]+$ ]] || [ "$REPLICAS" -lt 1 ] || [ "$REPLICAS" -gt 32 ]; then
        die "CLUSTER_REPLICAS=$REPLICAS: expected a number from 1 to 32"
    fi
    if [ -f "$STATE" ]; then
        local kind name pid port marker
        while read -r kind name pid port marker; do
            if [ "$pid" != - ] && alive "$pid" "$marker"; then
                die "already running (data/cluster/state); see: scripts/cluster.sh status; stop it with: make cluster-stop"
            fi
        done <"$STATE"
        rm -f "$STATE"   # stale: nothing recorded is alive
    fi

    # Ports first: fail before starting anything.
    local i port
    port_busy "$LB_PORT" && die "port $LB_PORT is in use (make run?); the balancer listens there"
    for ((i = 0; i < REPLICAS; i++)); do
        port=$((BASE_PORT + i))
        port_busy "$port" && die "port $port is in use; set CLUSTER_BASE_PORT to another range"
    done

    # nginx from Debian's package when missing. Like pg.sh does for
    # PostgreSQL, stop the system service the package may start: ours is private.
    if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
        log "nginx not found; installing the Debian package 'nginx'"
        local sudo=""
        [ "$(id -u)" -ne 0 ] && sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx >/dev/null
        $sudo service nginx stop >/dev/null 2>&1 || true
    fi
    local NGINX
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)

    # The binary.
    local BIN
    if [ -n "${PHONE_BIN:-}" ]; then
        BIN=$(realpath "$PHONE_BIN")
        [ -x "$BIN" ] || die "PHONE_BIN=$PHONE_BIN is not an executable"
    else
        log "building the release binary (cargo build --release)"
        cargo build --release --quiet
        BIN="$ROOT/target/release/phone"
    fi

    mkdir -p "$DIR"
    : >"$STATE"

    # The database: DATABASE_URL if set, else the private cluster of make run.
    local DB_URL
    if [ -n "${DATABASE_URL:-}" ]; then
        DB_URL=$DATABASE_URL
        log "using DATABASE_URL from the environment"
    else
        local pg_was_running=no
        # pg.sh start is idempotent; find out first whether it was running, so
        # that stop only stops what start started.
        if psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc "SELECT 1" >/dev/null 2>&1; then
            pg_was_running=yes
        fi
        scripts/pg.sh start data/pg "$PG_PORT"
        if [ "$pg_was_running" = no ]; then record postgres pg - "$PG_PORT" data/pg; fi
        psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'phone'" | grep -q 1 \
            || psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "CREATE DATABASE phone" >/dev/null
        DB_URL=$(scripts/pg.sh url "$PG_PORT" phone)
        log "PostgreSQL in ./data/pg on port $PG_PORT ($([ "$pg_was_running" = yes ] && echo "already running, left running on stop" || echo "started; cluster-stop stops it"))"
    fi

    # The replicas: same binary, same database, one port each, loopback only
    # (only nginx is reachable from outside).
    local pid pids=()
    for ((i = 1; i <= REPLICAS; i++)); do
        port=$((BASE_PORT + i - 1))
        # Only nginx can reach a replica (loopback), and nginx appends the
        # client's address to X-Forwarded-For: per-client limits must use it.
        DATABASE_URL="$DB_URL" PORT="$port" PHONE_BIND=127.0.0.1 \
            PHONE_TRUST_FORWARDED_FOR="${PHONE_TRUST_FORWARDED_FOR:-true}" \
            setsid "$BIN" >"$DIR/replica-$i.log" 2>&1 </dev/null &
        pid=$!
        record replica "$i" "$pid" "$port" "$BIN"
        pids+=("$pid")
        log "replica $i: pid $pid on 127.0.0.1:$port (log data/cluster/replica-$i.log)"
    done
    for ((i = 1; i <= REPLICAS; i++)); do
        port=$((BASE_PORT + i - 1))
        if ! wait_healthy "http://127.0.0.1:$port/health" "${pids[i - 1]}" "$BIN" 60; then
            echo "cluster: replica $i (port $port) did not become healthy; its log:" >&2
            tail -n 20 "$DIR/replica-$i.log" >&2 || true
            cmd_stop >&2
            exit 1
        fi
    done
    log "all $REPLICAS replicas answer /health"

    # nginx: deploy/nginx.conf linked into its prefix, next to the generated
    # upstream list it includes.
    mkdir -p "$NGINX_PREFIX"
    ln -sfn "$ROOT/deploy/nginx.conf" "$NGINX_PREFIX/nginx.conf"
    {
        echo "# Generated by scripts/cluster.sh start; included by deploy/nginx.conf."
        for ((i = 0; i < REPLICAS; i++)); do
            echo "server 127.0.0.1:$((BASE_PORT + i)) max_fails=2 fail_timeout=10s;"
        done
    } >"$NGINX_PREFIX/phone-upstream.conf"
    local ngx_args=(-e stderr -p "$NGINX_PREFIX/" -c "$NGINX_PREFIX/nginx.conf")
    if ! "$NGINX" -t -q "${ngx_args[@]}"; then
        cmd_stop >&2
        die "nginx rejected its configuration"
    fi
    setsid "$NGINX" "${ngx_args[@]}" -g 'daemon off;' \
        >>"$DIR/nginx-access.log" 2>>"$DIR/nginx-error.log" </dev/null &
    pid=$!
    record nginx lb "$pid" "$LB_PORT" "$NGINX_PREFIX/"
    if ! wait_healthy "http://127.0.0.1:$LB_PORT/lb-health" "$pid" "$NGINX_PREFIX/" 15; then
        tail -n 20 "$DIR/nginx-error.log" >&2 || true
        cmd_stop >&2
        die "nginx did not start"
    fi

    cat <<EOF
cluster: up: $REPLICAS replicas behind nginx (round robin)
  MCP endpoint   http://localhost:$LB_PORT/mcp
  health         http://localhost:$LB_PORT/health   (nginx itself: /lb-health)
  replicas       $(for ((i = 0; i < REPLICAS; i++)); do printf 'http://127.0.0.1:%s ' $((BASE_PORT + i)); done)
  logs           data/cluster/replica-N.log, data/cluster/nginx-access.log (upstream=<replica>), nginx-error.log
  status / stop  scripts/cluster.sh status / make cluster-stop
  Claude Code    claude mcp add --transport http phone http://localhost:$LB_PORT/mcp
EOF
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
