#!/usr/bin/env bash
# `make chaos`: the fault suite (tests/chaos/) against its own durable
# PostgreSQL cluster, which the tests crash and restart.
#
#   scripts/chaos.sh [nextest args]   fresh cluster under data/chaos-pg (port 25433),
#                                     run every chaos test one at a time, print the
#                                     results table (target/chaos/results.md); the
#                                     failover test runs its own pg_auto_failover
#                                     formation (scripts/failover.sh, ports 25751-25753,
#                                     data/chaos-paf), installed first if missing
#   scripts/chaos.sh pg-crash         stop that cluster in immediate mode (a crash)
#   scripts/chaos.sh pg-start         start it again (crash recovery) and wait
#
# Bounded: each test bounds its loops by count and time (about 5 minutes in
# all on 2 cores); the whole run is killed after PHONE_CHAOS_TIMEOUT seconds.
# Loopback only. PHONE_CHAOS_STRICT=1 fails the run on known weaknesses
# (findings) too, not only on broken guarantees.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PHONE_CHAOS_PG_PORT:-25433}
dir=${PHONE_CHAOS_PG_DIR:-data/chaos-pg}

find_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
    done
    return 1
}

as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

case "${1:-}" in
pg-crash)
    bin=$(find_bindir)
    as_owner "$bin/pg_ctl" -D "$(realpath -m "$dir")" -m immediate -w stop >/dev/null
    exit 0
    ;;
pg-start)
    scripts/pg.sh start "$dir" "$port"
    exit 0
    ;;
esac

out=target/chaos
scripts/pg.sh stop "$dir"
scripts/failover.sh down
rm -rf "$dir" "$out"
mkdir -p "$out/logs"
# The failover faults' pg_auto_failover (Debian's packages), installed before
# any PostgreSQL of this run starts: an install can upgrade the PostgreSQL
# packages, and a server already running could then not load plpgsql.
scripts/failover.sh install
# Durable (fsync, synchronous_commit on): a crash must not lose what was acknowledged.
scripts/pg.sh start "$dir" "$port"
trap 'scripts/pg.sh stop "$dir"; scripts/failover.sh down' EXIT
export PHONE_CHAOS_DATABASE_URL=$(scripts/pg.sh url "$port")
export PHONE_CHAOS_PG_DIR=$dir PHONE_CHAOS_PG_PORT=$port PHONE_CHAOS_OUT=$PWD/$out

cat >"$out/results.md" <<'EOF'
| fault | load | acknowledged | delivered | lost | duplicated | recovery time | notes |
|---|---|---|---|---|---|---|---|
EOF
: >"$out/findings.md"

cargo build --bin phone --tests --quiet
started=$(date +%s)
status=0
if cargo nextest --version >/dev/null 2>&1; then
    timeout "${PHONE_CHAOS_TIMEOUT:-600}" cargo nextest run --test chaos --run-ignored only \
        --test-threads 1 --no-fail-fast --no-capture "$@" || status=$?
else
    timeout "${PHONE_CHAOS_TIMEOUT:-600}" cargo test --test chaos -- --ignored --test-threads 1 --nocapture "$@" || status=$?
fi

echo
echo "chaos: results ($(( $(date +%s) - started )) s; replica logs in $out/logs)"
cat "$out/results.md"
if [ -s "$out/findings.md" ]; then
    echo
    echo "chaos: findings (known weaknesses; PHONE_CHAOS_STRICT=1 makes them fail the run)"
    cat "$out/findings.md"
fi
exit "$status"
