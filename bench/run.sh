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
mkdir -p data

build_start=$(date +%s)
echo "bench: building release binaries (phone, phone-bench)" >&2
cargo build --release --bins --quiet
echo "bench: build took $(( $(date +%s) - build_start )) s" >&2

# Durable mode (fsync and synchronous_commit on), unlike the tests' cluster.
# 54332 lies in Linux's ephemeral port range (32768-60999): on a busy
# machine a client socket (even one in TIME-WAIT) may hold it. Retry, then
# fall back to a port below that range.
started=""
for p in "$port" "$port" "$port" 25432 25432; do
    if scripts/pg.sh start "$dir" "$p" 2>data/bench-pg.start.err; then started=$p; break; fi
    echo "bench: PostgreSQL could not start on port $p (in use?); retrying" >&2
    sleep 2
done
if [ -z "$started" ]; then cat data/bench-pg.start.err >&2; exit 1; fi
port=$started
trap 'scripts/pg.sh stop "$dir"' EXIT

# Bounded: phone-bench keeps to its own time budget; this is the backstop.
limit=900
for a in "$@"; do [ "$a" = --quick ] && limit=300; done
timeout --signal=TERM --kill-after=20 "$limit" \
    ./target/release/phone-bench run --pg-port "$port" --pg-dir "$dir" --command "$command" "$@"
