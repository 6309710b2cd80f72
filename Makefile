# storage-events: `make run` (local default) and `make test` (the whole suite) are the two
# commands a newcomer needs; everything else here is what they are built of.

# The interpreter the virtualenv is made with: one that pyproject.toml's requires-python takes
# (3.11 to 3.13), the first of python3.11, python3.12, python3.13 and python3 that is one
# (PYTHON=/path/to/python3.x names one). The full suite runs on 3.11 in CI.
PYTHON_VERSIONS := 3.11 3.12 3.13
PYTHON_NAMES := 3.11, 3.12 or 3.13
FITS := import sys; sys.exit("%d.%d" % sys.version_info[:2] not in "$(PYTHON_VERSIONS)".split())
PYTHON ?= $(or $(shell for p in $(addprefix python,$(PYTHON_VERSIONS)) python3; do $$p -c '$(FITS)' >/dev/null 2>&1 && { command -v $$p; break; }; done),python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
INSTANCE ?= default
PYTEST_ARGS ?=

# The functional core's pure modules (MODULES in streams/core/compiled.py) compiled with mypyc
# in place when a C compiler is there, interpreted otherwise; one line says which. Rebuilt
# whenever one of the files it is built from changes (its modules and the project modules they
# import: `python streams/core/compiled.py sources`); an import-time check runs the sources
# of a build that is not theirs all the same (docs/commands.md, "The compiled core").
# PURE=1 (or STORAGE_EVENTS_PURE=1 in the environment) builds nothing: interpreted.
PURE ?= $(STORAGE_EVENTS_PURE)
CORE_PURE := $(filter-out 0,$(PURE))
CORE_STAMP := $(VENV)/.core-$(if $(CORE_PURE),pure,compiled)
CORE_SOURCES := $(shell $(PYTHON) streams/core/compiled.py sources 2>/dev/null) $(wildcard streams/core/compiled.py dev/compile_core.py)

.PHONY: install test-deps kafka kafka-stop kafka-fetch run test test-fast tail lint format bench bench-normalizers clean

# What running needs: the virtualenv with the project and its dependencies (`make run` adds
# the Kafka broker jars, through dev/kafka/localkafka.py), and the functional core compiled
# (CORE_STAMP above). Re-installs only when pyproject.toml changed: a second `make install` does nothing
# slow.
install: $(STAMP) $(CORE_STAMP)

# The virtualenv, made by a Python that fits: one made by another (a python3 that was 3.10) is
# re-created, never kept; without a fitting one, one line says what to install.
.PHONY: venv
venv:
	@if [ -e $(VENV) ] && ! $(BIN)/python -c '$(FITS)' >/dev/null 2>&1; then \
	  echo "make: $(VENV) was made by $$($(BIN)/python -V 2>&1 || echo 'a Python that is gone'), not Python $(PYTHON_NAMES): re-creating it"; \
	  rm -rf $(VENV); fi
	@test -x $(BIN)/python || { \
	  $(PYTHON) -c '$(FITS)' >/dev/null 2>&1 || { \
	    echo "make: storage-events needs Python $(PYTHON_NAMES) (pyproject.toml requires-python), and $(PYTHON) is $$($(PYTHON) -V 2>&1 || echo 'not found'): install one (Debian packages python3.13 and python3.13-venv, or python3.11), or name one with PYTHON=/path/to/python3.13" >&2; exit 1; }; \
	  $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }; }

# setuptools' editable install warns, in a 10-line block, about folders named like the packages
# in the working directory: here they are the packages.
QUIET_EDITABLE := PYTHONWARNINGS=ignore::Warning:setuptools.command.editable_wheel

# A virtualenv of another Python is re-made whatever its stamp says.
VENV_WRONG := $(shell [ -e $(VENV) ] && ! $(BIN)/python -c '$(FITS)' >/dev/null 2>&1 && echo wrong)

# The project and the consumer library's own distribution (fileevents/, which the project
# depends on and which is on no package index), both editable, in one resolve.
$(STAMP): pyproject.toml $(wildcard fileevents/pyproject.toml) $(if $(VENV_WRONG),venv) | venv
	$(BIN)/pip install --quiet --upgrade pip
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e . -e ./fileevents || { rm -f $(STAMP); exit 1; }
	@touch $(STAMP)

$(CORE_STAMP): $(STAMP) $(CORE_SOURCES)
	@$(BIN)/python dev/compile_core.py --stamp $@$(if $(CORE_PURE), --pure)

# What only the tests need, one prerequisite per tool; each says what it installs when it
# does (`make test: installing ...`), and nothing when it is there already.
test-deps: $(TEST_STAMP) node_modules/.installed redis-server promtool pushgateway pubsub-fake

# Names only, for the lines that say what is installed (read from the files that pin them).
PY_TEST_TOOLS = $(shell $(PYTHON) -c 'import re, tomllib; print(", ".join(re.split(r"[^A-Za-z0-9._-]", r)[0] for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))')
NPM_TEST_TOOLS = $(shell $(PYTHON) -c 'import json; print(", ".join(json.load(open("package.json"))["devDependencies"]))')

# pyproject.toml's [test] extra: pytest and the libraries, linters and checkers the suite uses.
$(TEST_STAMP): $(STAMP)
	@echo "make test: installing the Python test tools of pyproject.toml [test] into $(VENV): $(PY_TEST_TOOLS)"
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[test]' -e ./fileevents
	@touch $(TEST_STAMP)

# Emulators and tools the tests start (Azurite, ...), from the npm registry, pinned by
# package-lock.json.
node_modules/.installed: package.json package-lock.json
	@echo "make test: installing the test tools of package.json from npm (npm ci): $(NPM_TEST_TOOLS)"
	npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	@touch node_modules/.installed

# Debian's redis-server, which the consumer library's tests start (tests/support/redis_server.py).
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null || { \
	  echo "make test: installing redis-server (Debian package, apt-get) for the consumer library's tests"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
	  else echo "redis-server is missing: run 'sudo apt-get install redis-server', then make again" >&2; exit 1; fi; }

# Debian's prometheus package: `promtool check rules` on k8s/monitoring/prometheusrule.yaml,
# and the `prometheus` server that scrapes a test worker (tests/k8s/test_monitoring*.py).
# Without recommends (node-exporter, smartmontools); the package's own service, where systemd
# starts it, listens on 9090; the tests run their own server on a free port.
.PHONY: promtool
promtool:
	@{ command -v promtool && command -v prometheus; } >/dev/null || { \
	  echo "make test: installing prometheus (Debian package, apt-get: promtool and the server) for the k8s/monitoring tests"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; \
	  else echo "promtool/prometheus are missing: run 'sudo apt-get install --no-install-recommends prometheus', then make again" >&2; exit 1; fi; }

# Debian's Prometheus Pushgateway, where reconcile runs push their metrics
# (tests/support/pushgateway.py; the tests run it on a free port, without persistence).
.PHONY: pushgateway
pushgateway:
	@command -v prometheus-pushgateway >/dev/null || { \
	  echo "make test: installing prometheus-pushgateway (Debian package, apt-get) for the reconcile metrics tests"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus-pushgateway; \
	  else echo "prometheus-pushgateway is missing: run 'sudo apt-get install --no-install-recommends prometheus-pushgateway', then make again" >&2; exit 1; fi; }

# Google's Pub/Sub fake (pstest, of the Go Pub/Sub client) for the Pub/Sub bridge's tests
# (tests/support/pubsub_emulator.py), built from dev/pubsub-fake with the modules its go.sum
# pins (Go module proxy); rebuilt only when its sources change.
PUBSUB_FAKE := $(BIN)/pubsub-fake
PUBSUB_FAKE_SOURCES := dev/pubsub-fake/main.go dev/pubsub-fake/go.mod dev/pubsub-fake/go.sum
.PHONY: pubsub-fake
pubsub-fake: $(PUBSUB_FAKE)

$(PUBSUB_FAKE): $(PUBSUB_FAKE_SOURCES) | $(STAMP)
	@command -v go >/dev/null || { echo "go is missing: install Go (1.26 or later), then make again" >&2; exit 1; }
	@echo "make test: building the Pub/Sub fake (Go: cloud.google.com/go/pubsub/v2/pstest) into $(PUBSUB_FAKE)"
	cd dev/pubsub-fake && GOFLAGS=-mod=mod go build -trimpath -o $(abspath $(PUBSUB_FAKE)) .

# `make kafka KAFKA_BROKERS=3`: a local three-broker cluster instead (its own ports and
# state directory; `make kafka-stop KAFKA_BROKERS=3` stops it).
# `make kafka KAFKA_SECURITY=sasl_ssl` (TLS + SCRAM-SHA-512 + ACLs) or `ssl` (mutual TLS):
# a secured listener; `set -a; . <state dir>/client.env` (the start prints the line) points any
# command at it. LOCAL_KAFKA_PORT=<port> (in the environment or as a make variable) moves the
# broker, and `make run` / `make tail` with it.
kafka:
	@$(PYTHON) dev/kafka/localkafka.py start$(if $(KAFKA_BROKERS), --brokers $(KAFKA_BROKERS))$(if $(KAFKA_SECURITY), --security $(KAFKA_SECURITY))

kafka-stop:
	@$(PYTHON) dev/kafka/localkafka.py stop$(if $(KAFKA_BROKERS), --brokers $(KAFKA_BROKERS))

kafka-fetch:
	@$(PYTHON) dev/kafka/localkafka.py fetch >/dev/null

run: install
	@$(BIN)/python dev/run.py

# The whole suite, slow tests included (CI runs exactly this), and beside it (dev/beside.sh:
# niced, its output after the main suite's) the fast suites on the other Pythons the project
# supports where they are installed (dev/other_pythons.sh) and the fileevents distribution
# alone (dev/fileevents-alone.sh); not with PYTEST_ARGS, which picks tests.
OTHER_PYTHONS ?= 3.12 3.13
MAIN_SUITE = PUBSUB_FAKE_BIN=$(abspath $(PUBSUB_FAKE)) $(BIN)/python -m pytest
test: test-deps install kafka-fetch
	$(if $(PYTEST_ARGS),$(MAIN_SUITE) $(PYTEST_ARGS),@dev/beside.sh \
	  "dev/other_pythons.sh $(OTHER_PYTHONS); s=\$$?; dev/fileevents-alone.sh $(FILEEVENTS_PYTHONS) && exit \$$s" \
	  env $(MAIN_SUITE))

# The consumer library's distribution installed alone (no storage-events) in a fresh
# virtualenv of the oldest and the newest Python it supports, its suite run there against a
# local broker (dev/fileevents-alone.sh); `make test` runs this last. About a minute per
# Python once the virtualenvs exist.
FILEEVENTS_PYTHONS ?= 3.10 3.13
.PHONY: test-fileevents
test-fileevents: install kafka-fetch redis-server
	@dev/fileevents-alone.sh $(FILEEVENTS_PYTHONS)

# Everything but the slow chaos and load tests.
test-fast: test-deps install kafka-fetch
	PUBSUB_FAKE_BIN=$(abspath $(PUBSUB_FAKE)) $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# The environment of the stack a command belongs to (dev/stack.py, streams/localstack.py): the
# running `make run`'s Kafka settings and ports, wherever LOCAL_KAFKA_PORT, WEBHOOK_PORT and
# STREAMS_WEB_PORT moved them; without one (and without KAFKA_BOOTSTRAP_SERVERS), the local
# broker's client settings (its port, its security). What is set in the environment wins.
STACK_ENV = stack_env="$$($(PYTHON) dev/stack.py env)" || exit 1; set -a; eval "$$stack_env"; set +a

# A command-line variable the command does not take stops it with one line (`make tail
# TOPIX=...` is not silently ignored); these are taken by every command.
ANY_COMMAND_VARIABLES := PYTHON PURE PYTEST_ARGS LOCAL_KAFKA_PORT LOCAL_KAFKA_DIR \
  LOCAL_KAFKA_SECURITY LOCAL_KAFKA_HEAP LOCAL_KAFKA_LIBS KAFKA_BOOTSTRAP_SERVERS KAFKA_BROKERS \
  KAFKA_SECURITY WEBHOOK_PORT STREAMS_WEB_PORT
GIVEN_VARIABLES = $(sort $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $v)),$v)))
# $(call only_variables,<command>,<its variables>): the recipe line that refuses the others.
only_variables = $(if $(filter-out $(2) $(ANY_COMMAND_VARIABLES),$(GIVEN_VARIABLES)),@echo "make $(1): unknown variable $(filter-out $(2) $(ANY_COMMAND_VARIABLES),$(GIVEN_VARIABLES)) (make $(1) takes $(2))" >&2; exit 2,@:)

# The "Try it" notification as a new change each time (a fresh sequencer; KEY=<key> for
# another key): the same notification twice is one change, dropped the second time by design.
.PHONY: send
send:
	$(call only_variables,send,KEY)
	@$(STACK_ENV); exec $(PYTHON) dev/send.py$(if $(KEY), --key '$(KEY)')

# An instance's canonical events (INSTANCE=<name>), or any topic's records (TOPIC=<topic>:
# files.stale.<instance>, files.dead-letter); Kafka: the stack's (STACK_ENV above).
# `exec`: Ctrl-C ends the tail, not make with an `Interrupt` line.
tail: install
	$(call only_variables,tail,INSTANCE TOPIC HEADERS FROM_END)
	@$(STACK_ENV); \
	exec $(BIN)/python -m streams tail --instance $(INSTANCE)$(if $(TOPIC), --topic '$(TOPIC)')$(if $(HEADERS), --headers)$(if $(FROM_END), --from-end)

# What the stream could not process (files.dead-letter), one line each with the reason.
.PHONY: dead-letters
dead-letters: install
	$(call only_variables,dead-letters,FROM_END)
	@$(STACK_ENV); \
	exec $(BIN)/python -m streams dead-letters$(if $(FROM_END), --from-end)

# The stage groups' members, partition owners and lag, restore, events/s, duplicates, stale
# events and dead letters; `make status WATCH=1` refreshes it every 2 s. Kafka and the worker:
# the stack's (STACK_ENV above).
.PHONY: status
status: install
	$(call only_variables,status,WATCH)
	@$(STACK_ENV); \
	exec $(BIN)/python -m streams status$(if $(WATCH), --watch)

lint: $(TEST_STAMP)
	$(BIN)/ruff check streams connectors fileevents tests dev benchmarks examples
	$(BIN)/mypy
	cd fileevents && ../$(BIN)/mypy  # the distribution on its own, as Python 3.10 (its oldest)

format: $(TEST_STAMP)
	$(BIN)/ruff format streams connectors fileevents tests dev benchmarks examples

# The pipeline against the stack's ceiling on the local broker (prints figures; not a test).
bench: $(TEST_STAMP) kafka-fetch  # py-spy, for BENCH_ARGS=--profile
	$(BIN)/python -m benchmarks.pipeline $(BENCH_ARGS)

# Records per second per source through each normalizer, on one core (no Kafka).
bench-normalizers: install
	$(BIN)/python -m benchmarks.normalizers

# Chaos run on a private broker: SIGKILLs of the worker and a broker restart under load;
# fails on any lost change, order violation or missing dead letter (benchmarks/chaos.py).
.PHONY: chaos
chaos: install kafka-fetch
	$(BIN)/python -m benchmarks.chaos $(CHAOS_ARGS)

# Scale-out chaos run on the local broker: 3 workers under load, scale-out 1 -> 3, a SIGKILL
# and a SIGSTOP past the session timeout, scale-in 3 -> 2 leaving for good; fails on any lost,
# duplicated or misordered change, a worker exit it did not cause, or a scale-in whose
# partitions wait more than 5 s (benchmarks/scale_chaos.py; CHAOS_SCALE_ARGS=--engine ...).
.PHONY: chaos-scale
chaos-scale: install kafka-fetch
	$(BIN)/python -m benchmarks.scale_chaos $(CHAOS_SCALE_ARGS)

clean:
	$(PYTHON) dev/compile_core.py --clean
	rm -rf $(VENV) .venv-fileevents-* .pytest_cache .mypy_cache .hypothesis var build/mypyc
