#!/usr/bin/env bash
# The container image (Dockerfile), built and checked here with podman.
#
#   scripts/image.sh build   make image: local stand-ins for the Docker Hub base images
#                            (../shared/container/standin-images.sh), then the Dockerfile
#   scripts/image.sh check   make image-check: build, then run the image against a private
#                            PostgreSQL (data/image-pg, port 25434): /health and the image's
#                            own HEALTHCHECK, the seed's flow over /mcp, a non-root user,
#                            SIGTERM exits 0
#
# Docker Hub is out of reach from these machines and no Docker engine runs here; podman
# with the settings in ../shared/container does (see its README). Loopback only; bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
container=${PHONE_CONTAINER_TOOLS:-../shared/container}
podman=$container/podman
image=${PHONE_IMAGE:-phone:local}

if [ ! -x "$podman" ]; then
    echo "image: $podman not found: the container tooling of ../shared/container is needed (see docs/DEPLOY.md)" >&2
    exit 3
fi

build() {
    echo "image: base images (stand-ins for docker.io/library/debian and rust)" >&2
    "$container/standin-images.sh" >/dev/null
    local started=$(date +%s)
    echo "image: building $image from the Dockerfile" >&2
    mkdir -p data
    "$podman" build --network host --format docker -t "$image" . >data/image-build.log 2>&1 \
        || { tail -n 40 data/image-build.log >&2; echo "image: build failed (data/image-build.log)" >&2; exit 1; }
    echo "image: built in $(( $(date +%s) - started )) s; $("$podman" image inspect "$image" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')" >&2
}

rpc() {  # rpc PORT TOOL ARGS-JSON -> the JSON-RPC answer
    curl -fsS --max-time 10 "http://127.0.0.1:$1/mcp" \
        -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
        -H 'mcp-protocol-version: 2025-11-25' \
        -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"$2\",\"arguments\":$3}}"
}

field() {  # field JSON PATH (python-style: result.structuredContent.token)
    python3 -c 'import json,sys; v=json.loads(sys.argv[1]); [v:=v[int(k)] if k.isdigit() else v[k] for k in sys.argv[2].split(".")]; print(v)' "$1" "$2"
}

check() {
    build
    local pg_dir=data/image-pg pg_port=${PHONE_IMAGE_PG_PORT:-25434} port=${PHONE_IMAGE_PORT:-3907}
    local name=phone-image-check-$$
    scripts/pg.sh stop "$pg_dir"; rm -rf "$pg_dir"
    scripts/pg.sh start "$pg_dir" "$pg_port" fast
    trap "\"$podman\" rm -f $name >/dev/null 2>&1 || true; scripts/pg.sh stop $pg_dir" EXIT
    local url
    url=$(scripts/pg.sh url "$pg_port")

    echo "image: running $image against PostgreSQL on $pg_port, serving on $port" >&2
    "$podman" run -d --name "$name" --network host \
        -e DATABASE_URL="$url" -e PORT="$port" -e PHONE_LOG_FORMAT=text "$image" >/dev/null
    local healthy=0
    for _ in $(seq 1 100); do
        if curl -fsS --max-time 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; then healthy=1; break; fi
        sleep 0.2
    done
    [ "$healthy" = 1 ] || { "$podman" logs "$name" >&2; echo "image: /health never answered 200" >&2; exit 1; }
    echo "image: /health: $(curl -fsS "http://127.0.0.1:$port/health")" >&2
    "$podman" healthcheck run "$name" >/dev/null 2>&1 \
        || { echo "image: the image's HEALTHCHECK failed" >&2; exit 1; }
    echo "image: HEALTHCHECK ok" >&2
    local uid
    uid=$("$podman" exec "$name" id -u)
    [ "$uid" != 0 ] || { echo "image: runs as root" >&2; exit 1; }
    echo "image: runs as uid $uid" >&2

    # The seed's flow: register two agents, search, send, read, reply.
    local email coder token_email token_coder sent inbox reply
    email=$(rpc "$port" phone_register '{"name":"email","description":"Reads and sends invoice mail","project":"hassing"}')
    token_email=$(field "$email" result.structuredContent.token)
    coder=$(rpc "$port" phone_register '{"name":"coder","description":"Writes code","project":"hassing"}')
    token_coder=$(field "$coder" result.structuredContent.token)
    [ "$(field "$(rpc "$port" phone_search '{"query":"invoice mail"}')" result.structuredContent.agents.0.name)" = email ] \
        || { echo "image: search did not find email" >&2; exit 1; }
    sent=$(rpc "$port" phone_send "{\"name\":\"coder\",\"token\":\"$token_coder\",\"to\":\"email\",\"body\":\"Please fetch the latest invoice mail.\"}")
    inbox=$(rpc "$port" phone_inbox "{\"name\":\"email\",\"token\":\"$token_email\"}")
    [ "$(field "$inbox" result.structuredContent.messages.0.body)" = "Please fetch the latest invoice mail." ] \
        || { echo "image: the message did not arrive: $inbox" >&2; exit 1; }
    reply=$(rpc "$port" phone_send "{\"name\":\"email\",\"token\":\"$token_email\",\"reply_to\":\"$(field "$sent" result.structuredContent.id)\",\"body\":\"Found 3 invoices.\"}")
    inbox=$(rpc "$port" phone_inbox "{\"name\":\"coder\",\"token\":\"$token_coder\"}")
    [ "$(field "$inbox" result.structuredContent.messages.0.reply_to)" = "$(field "$sent" result.structuredContent.id)" ] \
        || { echo "image: the reply did not arrive: $inbox" >&2; exit 1; }
    echo "image: the seed's flow (register, search, send, inbox, reply) works" >&2

    # SIGTERM (what docker stop and Railway send): a graceful exit, status 0.
    "$podman" kill --signal TERM "$name" >/dev/null
    local status
    status=$(timeout 30 "$podman" wait "$name")
    [ "$status" = 0 ] || { "$podman" logs "$name" | tail -n 20 >&2; echo "image: exit status $status after SIGTERM" >&2; exit 1; }
    "$podman" logs "$name" 2>&1 | grep -q "shutting down" \
        || { echo "image: no graceful shutdown in the log" >&2; exit 1; }
    echo "image: SIGTERM: graceful shutdown, exit status 0" >&2
    echo "image-check: ok" >&2
}

case "${1:-}" in
build) build ;;
check) check ;;
*) echo "usage: $0 build | check" >&2; exit 2 ;;
esac
