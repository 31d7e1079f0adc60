#!/usr/bin/env bash
# `make bench` / `make bench-quick`: everything the benchmark needs, then the
# benchmark itself. Starts a private, durable PostgreSQL in ./data/bench-pg
# (port 54332, or PHONE_BENCH_PG_PORT), builds the release binaries, and runs
# phone-bench, which starts the replicas, drives them, runs the raw-SQL
# baselines and writes bench/RESULTS.md. Stops PostgreSQL when done.
#
#   bench/run.sh [--quick] [phone-bench options, e.g. --only mix,rate]
set -euo pipefail
cd "$(dirname "$0")/.."

command="bench/run.sh $*"
[ -n "${PHONE_BENCH_COMMAND:-}" ] && command=$PHONE_BENCH_COMMAND
port=${PHONE_BENCH_PG_PORT:-54332}
dir=data/bench-pg

build_start=$(date +%s)
echo "bench: building release binaries (phone, phone-bench)" >&2
cargo build --release --bins --quiet
echo "bench: build took $(( $(date +%s) - build_start )) s" >&2

# Durable mode (fsync and synchronous_commit on), unlike the tests' cluster.
# The port lies in Linux's ephemeral range: a client socket elsewhere on the
# machine may hold it for a moment. Retry a few times before giving up.
for attempt in 1 2 3 4 5 6; do
    if scripts/pg.sh start "$dir" "$port" 2>/dev/null; then break; fi
    if [ "$attempt" = 6 ]; then
        scripts/pg.sh start "$dir" "$port"   # once more, showing the error
        exit 1
    fi
    echo "bench: PostgreSQL could not start on port $port (in use?); retrying" >&2
    sleep 3
done
trap 'scripts/pg.sh stop "$dir"' EXIT

# Bounded: phone-bench keeps to its own time budget; this is the backstop.
limit=900
for a in "$@"; do [ "$a" = --quick ] && limit=300; done
timeout --signal=TERM --kill-after=20 "$limit" \
    ./target/release/phone-bench run --pg-port "$port" --pg-dir "$dir" --command "$command" "$@"
