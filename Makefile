# storage-events: `make run` (local default) and `make test` (the whole suite) are the two
# commands a newcomer needs; everything else here is what they are built of.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
INSTANCE ?= default
PYTEST_ARGS ?=

.PHONY: install kafka kafka-stop kafka-fetch run test test-fast tail lint format bench bench-normalizers clean

install: $(STAMP) node_modules/.installed redis-server

# Re-installs only when pyproject.toml changed: a second `make install` does nothing slow.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

# Emulators the tests start (Azurite), from the npm registry, pinned by package-lock.json.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	@touch node_modules/.installed

# Debian's redis-server, which the consumer library's tests start (tests/support/redis_server.py).
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
	  else echo "redis-server is missing: run 'sudo apt-get install redis-server', then make again" >&2; exit 1; fi; }

kafka:
	@$(PYTHON) dev/kafka/localkafka.py start

kafka-stop:
	@$(PYTHON) dev/kafka/localkafka.py stop

kafka-fetch:
	@$(PYTHON) dev/kafka/localkafka.py fetch >/dev/null

run: install
	@$(BIN)/python dev/run.py

# The whole suite, slow tests included (CI runs exactly this).
test: install kafka-fetch
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Everything but the slow chaos and load tests.
test-fast: install kafka-fetch
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

tail: install
	@$(BIN)/python -m streams tail --instance $(INSTANCE)

lint: install
	$(BIN)/ruff check streams connectors fileevents tests dev benchmarks examples
	$(BIN)/mypy

format: install
	$(BIN)/ruff format streams connectors fileevents tests dev benchmarks examples

# The pipeline against the stack's ceiling on the local broker (prints figures; not a test).
bench: install kafka-fetch
	$(BIN)/python -m benchmarks.pipeline $(BENCH_ARGS)

# Records per second per source through each normalizer, on one core (no Kafka).
bench-normalizers: install
	$(BIN)/python -m benchmarks.normalizers

# Chaos run on a private broker: SIGKILLs of the worker and a broker restart under load;
# fails on any lost change, order violation or missing dead letter (benchmarks/chaos.py).
.PHONY: chaos
chaos: install kafka-fetch
	$(BIN)/python -m benchmarks.chaos $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .hypothesis var
