#!/usr/bin/env bash
# Where the time goes under the pairs load (bench/PROFILE.md, carried into
# bench/RESULTS.md): the `mix` phase of `make bench` (10 s windows) with
#   - `perf record` of the replica and the bench cluster's backends over the
#     measured window of 1 replica, c=16: flat (self time) and with DWARF
#     call graphs (PHONE_BENCH_PROFILE, see bench/src/phase/mix);
#   - auto_explain on the bench's PostgreSQL for the run: EXPLAIN (ANALYZE,
#     BUFFERS) of one statement in 50, as the batcher sends it, under load,
#     in data/bench-pg/server.log; reset when the run ends.
# Then prints the split by process and the hottest symbols of each.
#
#   bench/profile.sh [phone-bench options]      # e.g. --base-port 4701
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PHONE_BENCH_PG_PORT:-25432}
dir=data/bench-pg
out=${PROFILE_OUT:-data/profile}
mkdir -p "$out"
out=$(realpath "$out")
psql_() { psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtAc "$1"; }

scripts/pg.sh start "$dir" "$port"
# Sampled, so the other statements run without the instrumentation.
# One session: the module must be loaded for its settings to be known.
psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtA -c "LOAD 'auto_explain'" \
    -c "ALTER SYSTEM SET session_preload_libraries = 'auto_explain'" \
    -c "ALTER SYSTEM SET auto_explain.log_min_duration = 0" \
    -c "ALTER SYSTEM SET auto_explain.sample_rate = 0.02" \
    -c "ALTER SYSTEM SET auto_explain.log_analyze = on" \
    -c "ALTER SYSTEM SET auto_explain.log_buffers = on" \
    -c "ALTER SYSTEM SET auto_explain.log_nested_statements = off"
psql_ "SELECT pg_reload_conf()" >/dev/null
log_from=$(stat -c %s "$dir/server.log")
reset() {
    scripts/pg.sh start "$dir" "$port"
    psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtA -c "LOAD 'auto_explain'" \
        -c "ALTER SYSTEM RESET session_preload_libraries" \
        -c "ALTER SYSTEM RESET auto_explain.log_min_duration" \
        -c "ALTER SYSTEM RESET auto_explain.sample_rate" \
        -c "ALTER SYSTEM RESET auto_explain.log_analyze" \
        -c "ALTER SYSTEM RESET auto_explain.log_buffers" \
        -c "ALTER SYSTEM RESET auto_explain.log_nested_statements"
    scripts/pg.sh stop "$dir"
}
trap reset EXIT

# The full mode's 10 s window, for enough samples on a busy machine.
PHONE_BENCH_PROFILE=$out PHONE_BENCH_PG_PORT=$port bench/run.sh --only mix \
    --out "$out/mix.md" "$@"

tail -c +"$((log_from + 1))" "$dir/server.log" > "$out/auto_explain.log"
data=$out/mix-r1-c16.flat.data
server=$(awk '/^server/ {print $2}' "$out/mix-r1-c16.pids")
postgres=$(awk '/^postgres/ {print $2}' "$out/mix-r1-c16.pids")
report() { perf report --stdio --no-children -g none "$@" 2>/dev/null | grep -v '^#' | grep -v '^$' || true; }
report -i "$data" --sort comm,dso --percent-limit 0.5 > "$out/by-process.txt"
report -i "$data" --pid "$server" --sort dso,sym --percent-limit 0.25 > "$out/phone-symbols.txt"
report -i "$data" --pid "$postgres" --sort dso,sym --percent-limit 0.25 > "$out/postgres-symbols.txt"
perf report -i "$out/mix-r1-c16.perf.data" --stdio --children --pid "$server" --sort sym \
    --percent-limit 1.5 -g none 2>/dev/null | grep -v '^#' | grep -v '^$' > "$out/phone-inclusive.txt" || true
# The batch statement's plans, per part (CTE), from auto_explain.
python3 bench/explain_parts.py "$out/auto_explain.log" > "$out/statement-parts.txt" || true
echo "profile: $out (by-process.txt, phone-symbols.txt, phone-inclusive.txt, postgres-symbols.txt, statement-parts.txt, auto_explain.log, mix.md)"
