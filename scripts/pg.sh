#!/usr/bin/env bash
# A private PostgreSQL cluster in a folder of this checkout, from the machine's
# PostgreSQL binaries: Debian's (installed when absent), else those of
# PG_BINDIR, `pg_config --bindir` or the PATH.
#
#   scripts/pg.sh start DIR PORT [fast]   init if needed, start, print nothing
#                                         (PG_TLS_DIR=DIR: TLS on, with DIR/server.pem
#                                         and DIR/server.key from scripts/tls-certs.sh)
#   scripts/pg.sh stop DIR                stop (fast mode)
#   scripts/pg.sh url PORT [DB]           print the connection URL
#
# PostgreSQL refuses to run as root; as root the cluster is owned by and run
# as the `postgres` user. "fast" trades durability for speed (tests only).
set -euo pipefail

find_bindir() {
    local d
    for d in ${PG_BINDIR:-} $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) \
        $(pg_config --bindir 2>/dev/null) $(command -v initdb >/dev/null && dirname "$(command -v initdb)"); do
        [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
    done
    return 1
}

ensure_postgres() {
    if ! find_bindir >/dev/null; then
        if ! command -v apt-get >/dev/null; then
            echo "pg.sh: PostgreSQL not found (no initdb under /usr/lib/postgresql/*/bin, PG_BINDIR, pg_config --bindir or the PATH); install it, or set DATABASE_URL" >&2
            exit 1
        fi
        echo "pg.sh: PostgreSQL not found; installing the Debian package 'postgresql'" >&2
        local sudo=""
        [ "$(id -u)" -ne 0 ] && sudo="sudo"
        $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >&2
        # The package starts a system cluster on 5432; ours are private.
        $sudo service postgresql stop >/dev/null 2>&1 || true
    fi
    BIN=$(find_bindir)
}

as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

cmd=${1:-}
case "$cmd" in
start)
    dir=$(realpath -m "$2"); port=$3; mode=${4:-durable}
    ensure_postgres
    mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$dir" && chmod 700 "$dir"
    if [ ! -f "$dir/PG_VERSION" ]; then
        as_owner "$BIN/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir.initdb.log" 2>&1 \
            || { cat "$dir.initdb.log" >&2; exit 1; }
    fi
    if as_owner "$BIN/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
        exit 0
    fi
    opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=400"
    if [ -n "${PG_TLS_DIR:-}" ]; then
        # PostgreSQL wants its key private to its own user.
        cp "$PG_TLS_DIR/server.pem" "$dir/tls-server.pem"
        cp "$PG_TLS_DIR/server.key" "$dir/tls-server.key"
        chmod 600 "$dir/tls-server.key"
        [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$dir/tls-server.pem" "$dir/tls-server.key"
        opts="$opts -c ssl=on -c ssl_cert_file=$dir/tls-server.pem -c ssl_key_file=$dir/tls-server.key"
    fi
    if [ "$mode" = fast ]; then
        opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        # Tests count how often a statement was planned (pg_stat_statements),
        # each in its own database: room for every test's statements (a run
        # of the suite leaves ~29,000; the default keeps 5,000 and evicts the
        # rest), none carried over from the run before.
        opts="$opts -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on"
        opts="$opts -c pg_stat_statements.max=50000 -c pg_stat_statements.save=off"
    fi
    as_owner "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -o "$opts" -w -t 60 start >/dev/null \
        || { tail -n 30 "$dir/server.log" >&2; exit 1; }
    ;;
stop)
    dir=$(realpath -m "$2")
    BIN=$(find_bindir) || exit 0
    [ -f "$dir/PG_VERSION" ] || exit 0
    as_owner "$BIN/pg_ctl" -D "$dir" -m fast -w stop >/dev/null 2>&1 || true
    ;;
url)
    echo "postgres://postgres@127.0.0.1:$2/${3:-postgres}"
    ;;
*)
    echo "usage: $0 start DIR PORT [fast] | stop DIR | url PORT [DB]" >&2
    exit 2
    ;;
esac
