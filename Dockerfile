# syntax=docker/dockerfile:1
#
# phone: a small runtime image with one static-ish binary (glibc) and curl for
# the health check. Used by docker-compose.yml (3 replicas behind nginx) and by
# Railway (railway.toml, builder = "DOCKERFILE").
#
#   docker build -t phone .
#   docker run -e DATABASE_URL=postgres://... -p 3000:3000 phone
#
# No BuildKit cache mounts (RUN --mount=type=cache): Railway requires its own
# id prefix on them; plain layers cache the same way everywhere.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

############################ build ############################
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
WORKDIR /build

# 1. Dependencies only. With just the manifests and a dummy lib + main, this
#    layer compiles every crate the server needs and is reused as long as the
#    manifests and Cargo.lock do not change: editing src/ rebuilds only phone.
#    Cargo.toml is a workspace with member bench/ (the benchmark, phone-bench):
#    cargo must read bench/Cargo.toml to load the workspace and check
#    Cargo.lock, so that manifest comes in too (.dockerignore lets only it
#    through from bench/) with a dummy main. The bench itself is never built:
#    `-p phone` resolves and compiles the server's dependencies only.
COPY Cargo.toml Cargo.lock ./
COPY bench/Cargo.toml ./bench/
RUN mkdir -p src bench/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > bench/src/main.rs \
    && cargo build --release --locked -p phone --bin phone \
    && rm -rf src

# 2. The application. Migrations are embedded at compile time (refinery), so
#    they are copied before building. COPY keeps the files' own mtimes, which
#    can be older than the dummy build above: touch them so cargo rebuilds.
#    `-p phone --bin phone`: the server only. bench/ keeps its dummy main from
#    step 1 (the workspace still needs the member) and is not built.
COPY migrations ./migrations
COPY src ./src
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked -p phone --bin phone \
    && install -D -m 0755 target/release/phone /out/phone

############################ run ############################
# Same Debian release as the builder: the binary links its glibc.
FROM debian:${DEBIAN_RELEASE}-slim AS runtime

# ca-certificates for any TLS the binary may do; curl for HEALTHCHECK.
# (Without curl: a distroless/cc image is smaller, but then the health check has
#  to be the platform's HTTP probe — Railway's healthcheckPath, a Kubernetes
#  httpGet — or a `phone --healthcheck` subcommand, which the binary lacks.)
# Versions come from the pinned Debian release's security-updated archive.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 phone \
    && useradd --system --uid 10001 --gid phone --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin phone

COPY --from=builder /out/phone /usr/local/bin/phone

# Numeric, so that runtimes that check "runAsNonRoot" can verify it.
USER 10001:10001

# Defaults only; platforms override PORT (Railway sets it). See docs/DEPLOY.md
# for every variable. JSON logs suit log collectors; set text for humans.
ENV PORT=3000 \
    PHONE_BIND=0.0.0.0 \
    PHONE_LOG_FORMAT=json \
    RUST_LOG=info

EXPOSE 3000

# /health is 200 only while this replica can commit on PostgreSQL. Through sh, so that
# $PORT is read when the check runs (the port the server really listens on).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["sh", "-c", "curl -fsS --max-time 2 -o /dev/null http://127.0.0.1:${PORT:-3000}/health || exit 1"]

# The binary handles SIGTERM itself: stops accepting, finishes requests in flight
# for up to PHONE_SHUTDOWN_GRACE_SECS (20), closes the pool. It runs as PID 1
# directly (exec form), so the signal reaches it.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/phone"]
