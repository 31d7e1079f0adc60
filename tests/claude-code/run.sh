#!/usr/bin/env bash
# The agent-side setup, checked as a user would do it, with the real Claude
# Code CLI (npm @anthropic-ai/claude-code, pinned in package-lock.json; its
# `plugin` and `mcp` commands run without a login):
#
#   1. `cargo install --locked --debug --path . --root <temporary root>`: the
#      binary an agent's machine gets (debug profile and this checkout's
#      target/, so that it reuses the test build instead of a 5-minute
#      release build; `cargo install --locked --path .` is the same install
#      in release mode).
#   2. That binary serves (bare `phone`), and its client commands work
#      against it: register (profile 0600), send, inbox (peek), whoami, and
#      `phone channel` driven over stdio (channel_check.py).
#   3. `claude plugin validate --strict` on plugins/phone and on the
#      marketplace (.claude-plugin/marketplace.json); the marketplace added
#      and the plugin installed from this checkout; `claude mcp list` shows
#      the server and the channel connected with the profile's token, with
#      the plugin's token option, and fails with a wrong token.
#   4. `claude -p --debug --dangerously-load-development-channels
#      plugin:phone@phone`: its debug log shows the channel connected on a
#      handshake revision ("protocolEra":"legacy", the one Claude Code
#      delivers channel notifications on) and the SessionStart hook's output.
#      (No model is reachable here, so no turn runs.)
#
#   tests/claude-code/run.sh          (scripts/test.sh runs it; PHONE_SKIP_CLAUDE_CODE=1 skips)
#
# Installs into PHONE_CLIENTS_CACHE (default ~/.cache/phone-clients)/claude-code;
# works under data/claude-code-run (HOME for Claude Code is a scratch folder
# there). Every network call goes to 127.0.0.1, except the npm install.
# Prints one line per check and `N passed, M failed`; exit 1 when any failed.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT" || exit 2

CACHE=${PHONE_CLIENTS_CACHE:-$HOME/.cache/phone-clients}/claude-code
WORK=$ROOT/data/claude-code-run
PG_DIR=$ROOT/data/claude-code-pg
PASSED=0
FAILED=0
SERVER_PID=""
PG_STARTED=""

mkdir -p "$ROOT/data"
exec 8>"$ROOT/data/claude-code.lock"
flock -n 8 || { echo "claude-code/run.sh: another run is going on in this checkout" >&2; exit 2; }
rm -rf "$WORK"
mkdir -p "$WORK" "$CACHE"

pass() { PASSED=$((PASSED + 1)); printf '  PASS  %s\n' "$1"; }
fail() {
    FAILED=$((FAILED + 1))
    printf '  FAIL  %s\n' "$1"
    [ -n "${2:-}" ] && [ -f "$2" ] && tail -n 15 "$2" | sed 's/^/    | /'
    return 0
}
# check NAME LOG COMMAND...: passes when the command exits 0.
check() {
    local name=$1 log=$2
    shift 2
    if timeout 300 "$@" >"$log" 2>&1; then pass "$name"; else fail "$name" "$log"; fi
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
finish() {
    cleanup
    echo ""
    echo "claude-code: $PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ]
    exit $?
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

echo "== install"
exec 7>"$CACHE.lock"
flock -w 1200 7 || { fail "install" ""; finish; }
stamp=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -c1-16)
if [ "$(cat "$CACHE/.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -x "$CACHE/node_modules/.bin/claude" ]; then
    echo "  installing @anthropic-ai/claude-code (package-lock.json) into $CACHE"
    rm -rf "$CACHE" && mkdir -p "$CACHE"
    cp "$HERE/package.json" "$HERE/package-lock.json" "$CACHE/"
    if (cd "$CACHE" && timeout 900 npm ci --no-audit --no-fund --loglevel=error) >"$WORK/install-npm.log" 2>&1; then
        echo "$stamp" >"$CACHE/.stamp"
    else
        fail "npm ci @anthropic-ai/claude-code" "$WORK/install-npm.log"
        finish
    fi
fi
flock -u 7
CLAUDE=$CACHE/node_modules/.bin/claude
echo "  $("$CLAUDE" --version 2>/dev/null)"

INSTALL_ROOT=$WORK/install
if timeout 1200 cargo install --locked --debug --quiet --path . --root "$INSTALL_ROOT" >"$WORK/cargo-install.log" 2>&1; then
    pass "cargo install --locked --debug --path . --root $(realpath --relative-to="$ROOT" "$INSTALL_ROOT")"
else
    fail "cargo install" "$WORK/cargo-install.log"
    finish
fi
PHONE=$INSTALL_ROOT/bin/phone
export PATH="$INSTALL_ROOT/bin:$PATH"
version=$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)
if [ "$(command -v phone)" = "$PHONE" ] && [ "$(phone --version)" = "phone $version" ]; then
    pass "the installed binary is the one on PATH: $(phone --version)"
else
    fail "installed binary on PATH (found $(command -v phone))" ""
fi

echo "== the installed binary serves, and its client commands talk to it"
pg_port=$(free_port)
scripts/pg.sh stop "$PG_DIR" >/dev/null 2>&1
rm -rf "$PG_DIR" "$PG_DIR.initdb.log"
PG_STARTED=1
if ! scripts/pg.sh start "$PG_DIR" "$pg_port" fast >"$WORK/pg.log" 2>&1 7>&- 8>&-; then
    fail "PostgreSQL" "$WORK/pg.log"
    finish
fi
port=$(free_port)
DATABASE_URL=$(scripts/pg.sh url "$pg_port") PORT=$port PHONE_BIND=127.0.0.1 RUST_LOG=warn \
    "$PHONE" >"$WORK/server.log" 2>&1 7>&- 8>&- &
SERVER_PID=$!
URL=http://127.0.0.1:$port
up=""
for _ in $(seq 1 150); do
    curl -fsS -m 2 "$URL/health" >/dev/null 2>&1 && { up=1; break; }
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.2
done
[ -n "$up" ] && pass "bare \`phone\` serves at $URL" || { fail "server start" "$WORK/server.log"; finish; }

# Each agent has its own config and state folders, as on its own machine:
# `env $(agent NAME) COMMAND…` runs COMMAND there.
agent() { echo "XDG_CONFIG_HOME=$WORK/$1/config XDG_STATE_HOME=$WORK/$1/state"; }
env $(agent bob) phone register bob -d "Receives mail in Claude Code" -p demo --url "$URL" >"$WORK/register-bob.log" 2>&1
BOB_TOKEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$WORK/bob/config/phone/profile.json" 2>/dev/null)
if [ -n "$BOB_TOKEN" ] && [ "$(grep -c "$BOB_TOKEN" "$WORK/register-bob.log")" = 1 ] \
    && [ "$(stat -c %a "$WORK/bob/config/phone/profile.json")" = 600 ]; then
    pass "phone register: token shown once, profile saved with mode 600"
else
    fail "phone register" "$WORK/register-bob.log"
fi
env $(agent alice) phone register alice -d "Sends mail" -p demo --url "$URL" >"$WORK/register-alice.log" 2>&1 \
    || fail "phone register alice" "$WORK/register-alice.log"
check "phone send (alice -> bob)" "$WORK/send.log" env $(agent alice) phone send bob "hello from the installed binary" -s "first"
check "phone whoami (bob)" "$WORK/whoami.log" sh -c "XDG_CONFIG_HOME='$WORK/bob/config' phone whoami | grep -q 'agent:  bob'"
check "phone inbox shows the mail and marks nothing read" "$WORK/inbox.log" sh -c \
    "XDG_CONFIG_HOME='$WORK/bob/config' phone inbox | grep -q 'from alice' && XDG_CONFIG_HOME='$WORK/bob/config' phone inbox --json | grep -q '\"unread_remaining\": 1'"
if grep -qs "$BOB_TOKEN" "$WORK/send.log" "$WORK/whoami.log" "$WORK/inbox.log"; then
    fail "no token in the client commands' output" ""
else
    pass "no token in the client commands' output"
fi
if env $(agent bob) python3 "$HERE/channel_check.py" "$PHONE" \
    env $(agent alice) phone send bob "second, while the channel runs" \
    >"$WORK/channel.log" 2>&1; then
    pass "phone channel over stdio: $(grep -o 'announced in [0-9]* ms' "$WORK/channel.log")"
else
    fail "phone channel over stdio" "$WORK/channel.log"
fi

echo "== the plugin and the marketplace, with Claude Code"
export HOME=$WORK/claude-home
# No telemetry, update checks or other traffic that is not to 127.0.0.1.
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1
mkdir -p "$HOME" "$WORK/project"
check "claude plugin validate --strict plugins/phone" "$WORK/validate-plugin.log" "$CLAUDE" plugin validate --strict "$ROOT/plugins/phone"
check "claude plugin validate --strict . (marketplace)" "$WORK/validate-marketplace.log" "$CLAUDE" plugin validate --strict "$ROOT"
check "claude plugin marketplace add ." "$WORK/marketplace-add.log" "$CLAUDE" plugin marketplace add "$ROOT"
check "claude plugin install phone@phone --config url=…" "$WORK/install-plugin.log" \
    "$CLAUDE" plugin install phone@phone -y --config "url=$URL"

# mcp_list NAME WHO EXPECT: `claude mcp list` as agent WHO's machine (its
# profile, or none), expecting the phone server's line to be "connected" or not.
mcp_list() {
    local name=$1 who=$2 expect=$3
    local log=$WORK/mcp-list-$who-$expect.log
    (cd "$WORK/project" && env $(agent "$who") timeout 180 "$CLAUDE" mcp list) >"$log" 2>&1
    local server channel
    server=$(grep -m1 '^plugin:phone:phone:' "$log")
    channel=$(grep -m1 '^plugin:phone:channel:' "$log")
    case "$expect" in
        connected)
            if [[ "$server" == *"✔ Connected"* && "$channel" == *"✔ Connected"* ]]; then
                pass "$name: server and channel ✔ Connected"
            else
                fail "$name" "$log"
            fi ;;
        refused)
            if [[ -n "$server" && "$server" != *"✔ Connected"* ]]; then
                pass "$name: ${server#*- }"
            else
                fail "$name (the server should not show as connected)" "$log"
            fi ;;
    esac
}
mcp_list "claude mcp list, token from the profile (phone login)" bob connected
set_token() { printf '{"token": "%s"}' "$1" | "$CLAUDE" plugin configure phone@phone --values-stdin >>"$WORK/configure.log" 2>&1; }
set_token "phn_0000000000000000000000000000000000000000000"
mcp_list "claude mcp list, a wrong token in the plugin option" nobody refused
set_token "$BOB_TOKEN"
mcp_list "claude mcp list, the token in the plugin option" nobody connected

(cd "$WORK/project" && env $(agent bob) timeout 180 "$CLAUDE" -p "hello" --debug \
    --dangerously-load-development-channels plugin:phone@phone) >"$WORK/claude-p.log" 2>&1
debug_log=$HOME/.claude/debug/latest
if grep -q '"plugin:phone:channel": Connection established.*"protocolEra":"legacy","negotiatedProtocolVersion":"2025-11-25"' "$debug_log" 2>/dev/null; then
    pass "claude --debug: the channel connected on 2025-11-25 (legacy era: channel notifications are delivered)"
else
    fail "claude --debug: the channel's connection" "$debug_log"
fi
if grep -q 'SessionStart.*provided additionalContext' "$debug_log" 2>/dev/null; then
    pass "claude --debug: the plugin's SessionStart hook told the session about unread mail"
else
    fail "claude --debug: the SessionStart hook" "$debug_log"
fi

# The channel gate runs in an interactive session only. With an API key (a
# made-up one; no model is called: nothing is typed, and the API URL is a
# closed loopback port) and the first-run dialogs answered in ~/.claude.json,
# the session starts in tmux and its debug log says whether the channel was
# registered or why not. Without a claude.ai login the answer is "channels
# feature is not currently available", which Claude Code checks only after
# the capability and the protocol era: passing those is what phone controls.
if command -v tmux >/dev/null 2>&1; then
    key=sk-ant-api03-phone-test-not-a-real-key-000000
    python3 - "$HOME/.claude.json" "$WORK/project" "$key" <<'PY'
import json, os, sys
path, project, key = sys.argv[1:]
d = json.load(open(path)) if os.path.exists(path) else {}
d.update({"hasCompletedOnboarding": True, "theme": "dark",
          "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []}})
d.setdefault("projects", {})[project] = {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
json.dump(d, open(path, "w"))
PY
    rm -f "$debug_log"
    session=phone-claude-code-$$
    tmux new-session -d -s "$session" -x 200 -y 50 -c "$WORK/project" \
        "env $(agent bob) ANTHROPIC_API_KEY=$key ANTHROPIC_BASE_URL=http://127.0.0.1:$(free_port) \
         '$CLAUDE' --debug --dangerously-load-development-channels plugin:phone@phone; sleep 60"
    gate=""
    for _ in $(seq 1 120); do
        gate=$(grep -m1 -o '"plugin:phone:channel": Channel notifications .*' "$debug_log" 2>/dev/null)
        [ -n "$gate" ] && break
        sleep 0.5
    done
    tmux capture-pane -t "$session" -p >"$WORK/claude-tui.txt" 2>/dev/null
    tmux kill-session -t "$session" 2>/dev/null
    cp "$debug_log" "$WORK/claude-tui-debug.log" 2>/dev/null
    case "$gate" in
        "")
            fail "claude (interactive) --debug: no channel gate decision in its debug log" "$WORK/claude-tui.txt" ;;
        *"did not declare claude/channel"* | *"modern protocol revision"*)
            fail "claude (interactive): the channel gate refused phone's channel: ${gate#*: }" "" ;;
        *)
            pass "claude (interactive) --debug: the channel passed the capability and protocol checks (${gate#*: })" ;;
    esac
else
    echo "  note: tmux is missing: the interactive channel gate check is skipped"
fi
finish
