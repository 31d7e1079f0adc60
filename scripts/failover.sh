#!/usr/bin/env bash
# A pg_auto_failover formation on loopback for `make chaos` (tests/chaos/failover.rs):
# a monitor, a primary and its synchronous secondary, from Debian's packages
# (postgresql-NN-auto-failover, pg-auto-failover-cli).
#
#   scripts/failover.sh install          install the packages when missing; call it BEFORE any
#                                        PostgreSQL of the run starts (see below); exits 0 either way
#   scripts/failover.sh up               create and run the monitor and two nodes, wait until one is
#                                        primary and the other secondary (~30 s); prints the node ports
#   scripts/failover.sh show ARGS…       pg_autoctl show ARGS… against the monitor (e.g. state --json)
#   scripts/failover.sh perform ARGS…    pg_autoctl perform ARGS… (e.g. failover --wait 60)
#   scripts/failover.sh kill-postmaster N  kill -9 node N's postmaster (its keeper restarts it)
#   scripts/failover.sh kill-node N      kill -9 node N's keeper and postmaster: the machine is gone,
#                                        the monitor fails over to the other node
#   scripts/failover.sh rejoin N         run node N's keeper again (it rejoins as a secondary)
#   scripts/failover.sh down             stop what `up` started and remove its folder
#
# Everything lives in $PHONE_CHAOS_PAF_DIR (data/chaos-paf): data folders, logs, pids, and the
# XDG folders where pg_autoctl keeps per-node state (a node's data deleted without them makes the
# next `create` fail). Ports: $PHONE_CHAOS_PAF_PORT (25751) for the monitor, +1 and +2 for nodes
# 1 and 2. As root, everything runs as the `postgres` user.
#
# Installing can upgrade the postgresql-NN package under a running cluster, whose server then
# cannot load plpgsql ("undefined symbol"): `install` refuses when apt would upgrade it while any
# PostgreSQL runs on the machine (scripts/chaos.sh calls it before starting its own cluster; in
# .ci/run, `make test` has stopped its cluster by then).
#
# The monitor's health checks are tuned for a bounded test (a dead node is failed over in about
# 10 s instead of about 50 s): primary_demote_timeout in particular also bounds how long the
# monitor waits for an unreachable primary to demote itself, so do not copy these values to a
# real deployment.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${PHONE_CHAOS_PAF_DIR:-data/chaos-paf}")
base=${PHONE_CHAOS_PAF_PORT:-25751}

find_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
    done
    return 1
}

as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- env "XDG_CONFIG_HOME=$dir/xdg/config" "XDG_DATA_HOME=$dir/xdg/data" \
            "XDG_RUNTIME_DIR=$dir/xdg/run" "PATH=$BIN:$PATH" "PG_CONFIG=$BIN/pg_config" "$@"
    else
        env "XDG_CONFIG_HOME=$dir/xdg/config" "XDG_DATA_HOME=$dir/xdg/data" \
            "XDG_RUNTIME_DIR=$dir/xdg/run" "PATH=$BIN:$PATH" "PG_CONFIG=$BIN/pg_config" "$@"
    fi
}

monitor_url="postgres://autoctl_node@127.0.0.1:$base/pg_auto_failover"

# Runs a keeper in the background, in a session of its own; records its pid.
run_keeper() {
    local name=$1
    as_owner bash -c "setsid pg_autoctl run --pgdata '$dir/$name' >>'$dir/$name.log' 2>&1 </dev/null & echo \$! >'$dir/$name.keeper'"
}

# The pids of a keeper and of its children (it forks a postgres supervisor and a node service).
keeper_pids() {
    local f=$dir/$1.keeper pid
    [ -f "$f" ] || return 0
    pid=$(cat "$f")
    # Only while that pid is still this keeper (pids are reused).
    ps -o args= -p "$pid" 2>/dev/null | grep -qF "$dir/$1" || return 0
    echo "$pid"
    ps -o pid= --ppid "$pid" 2>/dev/null || true
}

# The postmaster of a data folder, while it runs (its pid file may be stale).
postmaster_pid() {
    local pid
    [ -f "$dir/$1/postmaster.pid" ] || return 0
    pid=$(head -1 "$dir/$1/postmaster.pid")
    ps -o args= -p "$pid" 2>/dev/null | grep -qF "$dir/$1" && echo "$pid" || true
}

# Waits until the monitor reports one primary and one secondary, both as assigned.
wait_stable() {
    local deadline=$((SECONDS + ${1:-90})) state
    while [ $SECONDS -lt $deadline ]; do
        state=$(as_owner pg_autoctl show state --pgdata "$dir/monitor" 2>/dev/null || true)
        if echo "$state" | grep -Eq '\|\s+primary\s+\|\s+primary\s*$' &&
            echo "$state" | grep -Eq '\|\s+secondary\s+\|\s+secondary\s*$'; then
            return 0
        fi
        sleep 1
    done
    echo "failover.sh: the formation did not settle within ${1:-90} s:" >&2
    echo "$state" >&2
    return 1
}

BIN=$(find_bindir || echo /usr/lib/postgresql/15/bin)

case "${1:-}" in
install)
    command -v pg_autoctl >/dev/null 2>&1 && exit 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "failover.sh: pg_autoctl is missing and apt-get is not here; the failover faults will be skipped" >&2
        exit 0
    fi
    ver=$(basename "$(dirname "$BIN")")
    pkgs="postgresql-$ver-auto-failover pg-auto-failover-cli"
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >&2 || true
    if $sudo apt-get -s install $pkgs 2>/dev/null | grep -q "^Inst postgresql-$ver " &&
        pgrep -x postgres >/dev/null 2>&1; then
        echo "failover.sh: installing $pkgs would upgrade postgresql-$ver under a running PostgreSQL" \
            "(which could then not load plpgsql); stop it and run 'scripts/failover.sh install'," \
            "or install the packages by hand. The failover faults will be skipped." >&2
        exit 0
    fi
    echo "failover.sh: installing $pkgs (Debian packages)" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $pkgs >&2 ||
        echo "failover.sh: could not install $pkgs; the failover faults will be skipped" >&2
    ;;
up)
    command -v pg_autoctl >/dev/null 2>&1 || { echo "failover.sh: pg_autoctl is not installed" >&2; exit 2; }
    "$0" down
    mkdir -p "$dir/xdg/run"
    [ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$dir"
    chmod 700 "$dir/xdg/run"
    as_owner pg_autoctl create monitor --pgdata "$dir/monitor" --pgport "$base" \
        --hostname 127.0.0.1 --listen 127.0.0.1 --auth trust --no-ssl >"$dir/create-monitor.log" 2>&1 ||
        { cat "$dir/create-monitor.log" >&2; exit 1; }
    run_keeper monitor
    for _ in $(seq 1 60); do
        as_owner "$BIN/pg_isready" -q -h 127.0.0.1 -p "$base" && break
        sleep 0.5
    done
    for setting in health_check_period=1000 health_check_timeout=1000 health_check_max_retries=1 \
        health_check_retry_delay=500 node_considered_unhealthy_timeout=3000 primary_demote_timeout=5000; do
        as_owner "$BIN/psql" -qX -h 127.0.0.1 -p "$base" -U postgres -d pg_auto_failover \
            -c "ALTER SYSTEM SET pgautofailover.${setting%%=*} = ${setting#*=}" >/dev/null
    done
    as_owner "$BIN/psql" -qX -h 127.0.0.1 -p "$base" -U postgres -d pg_auto_failover \
        -c "SELECT pg_reload_conf()" >/dev/null
    for n in 1 2; do
        as_owner pg_autoctl create postgres --pgdata "$dir/node$n" --pgport $((base + n)) \
            --hostname 127.0.0.1 --listen 127.0.0.1 --auth trust --no-ssl --name "node$n" \
            --monitor "$monitor_url" --dbname phone >"$dir/create-node$n.log" 2>&1 ||
            { cat "$dir/create-node$n.log" >&2; exit 1; }
        run_keeper "node$n"
    done
    wait_stable 90
    echo "$((base + 1)) $((base + 2))"
    ;;
show | perform)
    what=$1; shift
    as_owner pg_autoctl "$what" "$@" --pgdata "$dir/monitor"
    ;;
kill-postmaster)
    pid=$(postmaster_pid "node$2")
    [ -n "$pid" ] || { echo "failover.sh: node$2's postmaster is not running" >&2; exit 1; }
    kill -9 "$pid"
    ;;
kill-node)
    pids="$(keeper_pids "node$2") $(postmaster_pid "node$2")"
    # shellcheck disable=SC2086
    kill -9 $pids
    ;;
rejoin)
    run_keeper "node$2"
    ;;
wait-stable)
    wait_stable "${2:-90}"
    ;;
down)
    [ -d "$dir" ] || exit 0
    for name in node2 node1 monitor; do
        pids=$(keeper_pids "$name" | head -1)
        [ -n "$pids" ] && kill -TERM "$pids" 2>/dev/null || true
    done
    for _ in $(seq 1 40); do
        alive=""
        for name in node2 node1 monitor; do alive="$alive$(keeper_pids "$name")"; done
        [ -z "$alive" ] && break
        sleep 0.25
    done
    for name in node2 node1 monitor; do
        pids="$(keeper_pids "$name") $(postmaster_pid "$name")"
        for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
    done
    rm -rf "$dir"
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
    ;;
esac
