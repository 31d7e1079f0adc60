#!/usr/bin/env bash
# `make bench` / `make bench-quick`: everything the benchmark needs, then the
# benchmark itself. Starts a private, durable PostgreSQL in ./data/bench-pg
# (port 25432, or PHONE_BENCH_PG_PORT), builds the release binaries, and runs
# phone-bench, which starts the replicas, drives them, runs the raw-SQL
# baselines and writes bench/RESULTS.md. Stops PostgreSQL when done.
#
#   bench/run.sh [--quick] [phone-bench options, e.g. --only mix,rate]
set -euo pipefail
cd "$(dirname "$0")/.."

command="bench/run.sh $*"
[ -n "${PHONE_BENCH_COMMAND:-}" ] && command=$PHONE_BENCH_COMMAND
port=${PHONE_BENCH_PG_PORT:-25432}
dir=data/bench-pg
mkdir -p data

build_start=$(date +%s)
echo "bench: building release binaries (phone, phone-bench)" >&2
# Two packages of one workspace, one invocation (features unified, one shared
# target dir): both binaries land in ./target/release.
cargo build --release --quiet -p phone --bin phone -p phone-bench --bin phone-bench
echo "bench: build took $(( $(date +%s) - build_start )) s" >&2

# Durable mode (fsync and synchronous_commit on), unlike the tests' cluster.
# Ports above 32767 lie in Linux's ephemeral port range (32768-60999): on a busy
# machine a client socket (even one in TIME-WAIT) may hold it. Retry, then
# fall back to a port below that range.
start_pg() {
    local p
    for p in "$port" "$port" "$port" 25432 25432; do
        if scripts/pg.sh start "$dir" "$p" 2>data/bench-pg.start.err; then port=$p; return 0; fi
        echo "bench: PostgreSQL could not start on port $p (in use?); retrying" >&2
        sleep 2
    done
    cat data/bench-pg.start.err >&2
    return 1
}
start_pg
# pg_stat_statements shows what the server asks of the database per call.
# It must be preloaded: set it once for this private cluster and restart.
preload=$(psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtAc "SHOW shared_preload_libraries")
case "$preload" in
    *pg_stat_statements*) ;;
    *)
        psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
        scripts/pg.sh stop "$dir"
        start_pg
        ;;
esac
psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" 2>/dev/null || true
trap 'scripts/pg.sh stop "$dir"' EXIT

# The long-poll phase holds 1,000 client connections in phone-bench: lift
# the soft open-files limit towards the hard one (it says so if too low).
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || ulimit -Sn 4096 2>/dev/null || true

# Bounded: phone-bench keeps to its own time budget (570 s full, 115 s quick,
# plus what the hot, webhooks, policy, quotas and before phases bring); this
# is the backstop (300 s cut a quick run with all of them short).
limit=1000
for a in "$@"; do [ "$a" = --quick ] && limit=600; done
# --foreground keeps Ctrl-C working; phone-bench stops its replicas on TERM.
timeout --foreground --signal=TERM --kill-after=20 "$limit" \
    ./target/release/phone-bench run --pg-port "$port" --pg-dir "$dir" --command "$command" "$@"
