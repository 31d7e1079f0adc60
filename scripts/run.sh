#!/usr/bin/env bash
# `make run`: the server on :3000. Without DATABASE_URL it starts a private
# PostgreSQL under ./data/pg and uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DATABASE_URL:-}" ]; then
    port=${PHONE_PG_PORT:-25429}
    scripts/pg.sh start data/pg "$port"
    psql -q -h 127.0.0.1 -p "$port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'phone'" | grep -q 1 \
        || psql -q -h 127.0.0.1 -p "$port" -U postgres -c "CREATE DATABASE phone" >/dev/null
    export DATABASE_URL=$(scripts/pg.sh url "$port" phone)
    echo "run: PostgreSQL in ./data/pg on port $port (stop it with: make db-stop)"
fi
export PORT=${PORT:-3000}
# This machine only, unless asked: the server's own default (0.0.0.0) is for
# containers and hosts behind a proxy. PHONE_BIND=0.0.0.0 make run opens it.
export PHONE_BIND=${PHONE_BIND:-127.0.0.1}
echo "run: building the release binary (cargo build --release; a few minutes the first time)"
cargo build --release
echo "run: serving on http://$PHONE_BIND:$PORT (MCP at /mcp, console at /console, Ctrl-C stops)"
exec ./target/release/phone
