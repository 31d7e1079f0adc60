.PHONY: help run test db-stop build clean clean-data bench bench-quick cluster cluster-stop chaos demo-data image image-check screenshots

## help: this list
help:
	@grep -E '^## ' Makefile | sed 's/^## /  make /'

## run: build and start the server on :3000 (a private PostgreSQL under ./data/ unless DATABASE_URL is set)
run:
	@scripts/run.sh

## test: the whole suite against a private PostgreSQL it starts itself
test:
	@scripts/test.sh

## chaos: the fault suite (kill -9, PostgreSQL crash, network cut, pool exhaustion, slow clients, vanishing callers, a replica killed mid webhook delivery, a database failover, one outsider against the defaults; stopped after PHONE_CHAOS_TIMEOUT=600 s) on its own PostgreSQL; see docs/RELIABILITY.md
chaos:
	@scripts/chaos.sh

## screenshots: drive the console in headless Chromium (tests/console_browser.rs) and refresh docs/console/*.png, which docs/CONSOLE.md shows
screenshots:
	@PHONE_SKIP_CLIENTS=1 PHONE_SCREENSHOT_DIR=$(CURDIR)/docs/console scripts/test.sh --test console_browser

## db-stop: stop the PostgreSQL that `make run` started
db-stop:
	@scripts/pg.sh stop data/pg

## cluster: CLUSTER_REPLICAS (3) release replicas on 127.0.0.1:3101.. behind nginx on :3000 (deploy/nginx.conf; see docs/DEPLOY.md)
cluster:
	@scripts/cluster.sh start

## cluster-stop: stop exactly what `make cluster` started (nginx, replicas, and PostgreSQL if it started it)
cluster-stop:
	@scripts/cluster.sh stop

## demo-data: a realistic message history (DEMO_MESSAGES=100000 over DEMO_DAYS=60) in database phone_demo, for the analytics views (docs/ANALYTICS.md)
demo-data:
	@scripts/demo-data.sh

## build: the release binary (target/release/phone)
build:
	cargo build --release

## clean: stop what make run / make cluster started and delete target/; keeps data/ (your local agents and their mail)
clean: cluster-stop db-stop
	rm -rf target

## clean-data: clean, and delete data/ too: the local PostgreSQL with every agent, token and message in it
clean-data: clean
	rm -rf data

## bench: the full benchmark (10M-message history, 1M-agent directory); writes bench/RESULTS.md, which says how long it took. Extra options: make bench ARGS="--only mix"
bench:
	@PHONE_BENCH_COMMAND="make bench $(ARGS)" bench/run.sh $(ARGS)

## bench-quick: the same at smaller sizes (the committed bench/RESULTS.md opens with one: every phase, 401 s after the build); same as make bench ARGS=--quick
bench-quick:
	@PHONE_BENCH_COMMAND="make bench-quick $(ARGS)" bench/run.sh --quick $(ARGS)

## image: build the container image with podman on local stand-ins for the Docker Hub base images (machines without Docker Hub; elsewhere: docker build -t phone ., see docs/DEPLOY.md)
image:
	@scripts/image.sh build

## image-check: build the image and run it against a private PostgreSQL: health, the seed's flow, non-root, SIGTERM exits 0
image-check:
	@scripts/image.sh check
