.PHONY: run test db-stop build clean

## run: build and start the server on :3000 (a private PostgreSQL under ./data/ unless DATABASE_URL is set)
run:
	@scripts/run.sh

## test: the whole suite against a private PostgreSQL it starts itself
test:
	@scripts/test.sh

## db-stop: stop the PostgreSQL that `make run` started
db-stop:
	@scripts/pg.sh stop data/pg

build:
	cargo build --release

clean: db-stop
	rm -rf data target
