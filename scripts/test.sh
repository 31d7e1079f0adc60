#!/usr/bin/env bash
# `make test`: the whole suite against a fresh private PostgreSQL (./data/test-pg).
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PHONE_TEST_PG_PORT:-25430}
dir=${PHONE_TEST_PG_DIR:-data/test-pg}

scripts/pg.sh stop "$dir"
rm -rf "$dir"
# TLS on, so that the tests can connect with every sslmode (tests/tls.rs).
tls_dir=$PWD/data/test-pg-tls
scripts/tls-certs.sh "$tls_dir"
PG_TLS_DIR=$tls_dir scripts/pg.sh start "$dir" "$port" fast
trap 'scripts/pg.sh stop "$dir"' EXIT
export PHONE_TEST_DATABASE_URL=$(scripts/pg.sh url "$port")
export PHONE_TEST_PG_TLS_DIR=$tls_dir

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: installing cargo-nextest" >&2
    cargo install --locked cargo-nextest >&2 || true
fi
# The cluster tests drive the real load balancer.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    echo "test: installing nginx (Debian package)" >&2
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light >&2 \
        || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx >&2
    $sudo service nginx stop >/dev/null 2>&1 || true
fi
# The console's browser test drives Debian's headless Chromium.
scripts/browser-setup.sh

status=0
if cargo nextest --version >/dev/null 2>&1; then
    # Tests wait on the network and the database more than on the CPU.
    cargo nextest run --no-fail-fast --test-threads "${PHONE_TEST_THREADS:-8}" "$@" || status=$?
else
    # cargo test takes the target selection (--test NAME) and a name filter
    # before "--", the harness's options after.
    cargo test --no-fail-fast "$@" -- --test-threads "${PHONE_TEST_THREADS:-8}" || status=$?
fi

# Clients and a conformance suite this project did not write (tests/clients).
if [ "${PHONE_SKIP_CLIENTS:-}" != 1 ]; then
    tests/clients/run.sh || status=1
fi
# The agent-side setup with the real Claude Code CLI: the installed binary,
# the plugin and the marketplace (tests/claude-code). PHONE_SKIP_CLIENTS=1
# skips it too.
if [ "${PHONE_SKIP_CLIENTS:-}" != 1 ] && [ "${PHONE_SKIP_CLAUDE_CODE:-}" != 1 ]; then
    tests/claude-code/run.sh || status=1
fi
exit $status
