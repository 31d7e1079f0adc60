#!/usr/bin/env bash
# `make test`: the whole suite against a fresh private PostgreSQL (./data/test-pg).
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PHONE_TEST_PG_PORT:-54330}
dir=data/test-pg

scripts/pg.sh stop "$dir"
rm -rf "$dir"
scripts/pg.sh start "$dir" "$port" fast
trap 'scripts/pg.sh stop "$dir"' EXIT
export PHONE_TEST_DATABASE_URL=$(scripts/pg.sh url "$port")

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: installing cargo-nextest" >&2
    cargo install --locked cargo-nextest >&2 || true
fi
if cargo nextest --version >/dev/null 2>&1; then
    # Tests wait on the network and the database more than on the CPU.
    cargo nextest run --no-fail-fast --test-threads "${PHONE_TEST_THREADS:-8}" "$@"
else
    cargo test --no-fail-fast -- --test-threads "${PHONE_TEST_THREADS:-8}" "$@"
fi
