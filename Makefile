# Switchboard: `make run` starts the platform, `make test` runs the suite. Nothing else is needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP_TOOLS := pip-tools==7.6.2

.PHONY: install lock sysdeps run restart-web network network-stop network-start network-status network-reset test test-fast stop lint bench clean

install: $(STAMP)

# Exactly what requirements-dev.lock pins, hash-checked (pip itself included), then the project,
# editable, without dependencies (the lock has them all) and built by the locked setuptools rather
# than whatever an isolated build would fetch; then, the same way, the Python client package
# (clients/python: switchboard_client, which the tests use; its httpx and websockets are in the lock).
$(STAMP): pyproject.toml requirements-dev.lock clients/python/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e clients/python
	@touch $(STAMP)

# Regenerates the lock files from pyproject.toml, keeping every pin that still fits (UPGRADE=1: the
# newest versions of everything). requirements.lock is what production installs; requirements-dev.lock
# adds the dev extra, constrained by requirements.lock so the tests run production's versions. pip,
# setuptools and wheel (which install and build the project) and pip-tools itself are no dependency
# of the project: they come in on stdin ("-r -" in the files). Where this machine's pip finds
# packages is left out of the files; the hashes pin the files themselves.
LOCK_TOOLS := pip setuptools wheel
LOCK_FLAGS := --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(PIP_TOOLS)
	printf '%s\n' $(LOCK_TOOLS) | CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile $(LOCK_FLAGS) \
		$(if $(UPGRADE),--upgrade) --output-file requirements.lock - pyproject.toml
	printf '%s\n' $(LOCK_TOOLS) $(PIP_TOOLS) | CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile $(LOCK_FLAGS) \
		$(if $(UPGRADE),--upgrade) --extra dev --constraint requirements.lock --output-file requirements-dev.lock - pyproject.toml

# WEB_NODES=3: HAProxy (Debian's package, installed when missing) on PORT in front of three web
# nodes; WORKERS=2: two routing workers. Both default to 1 (no HAProxy).
run: install
	$(BIN)/python -m devstack.supervise

# The web nodes of the running `make run` (same PORT), restarted one at a time, each drained first.
restart-web: install
	$(BIN)/python -m devstack.rolling

# The four-domain ring of the linker seed's meta example: domain-0N on ws://127.0.0.1:800N/ws, each
# with its own database, Redis database, web node, worker and beat (devstack.network). While it runs,
# one domain stops and starts alone: make network-stop DOMAIN=02, make network-start DOMAIN=02.
network: install
	$(BIN)/python -m devstack.network

network-stop: install
	$(BIN)/python -m devstack.network stop $(DOMAIN)

network-start: install
	$(BIN)/python -m devstack.network start $(DOMAIN)

network-status: install
	$(BIN)/python -m devstack.network status

# The ring forgotten: its four databases dropped, its Redis databases emptied, var/network/ deleted.
network-reset: install
	$(BIN)/python -m devstack.network reset

# What the tests need from the operating system (Chromium, a Java runtime for Spark, HAProxy, Node.js): installed
# with apt-get when missing and we are root, else a one-line instruction and a stop.
sysdeps: install
	$(BIN)/python -m devstack.sysdeps chromium java haproxy node

# The real socket.io-client the Socket.IO tests drive, at the version tests/node/package-lock.json pins.
NODE_STAMP := tests/node/node_modules/.installed
$(NODE_STAMP): tests/node/package-lock.json
	npm ci --prefix tests/node --no-audit --no-fund --loglevel=error
	@touch $(NODE_STAMP)

# The whole suite, on TEST_WORKERS pytest-xdist workers (a module's tests on one worker, so its
# processes start once; each worker with a Redis of its own: devstack.pytest_services).
# TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
PYTEST_DIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
# The project's bytecode, compiled once: every process the tests start (about two hundred) would
# compile it again where PYTHONDONTWRITEBYTECODE is set.
COMPILE = $(BIN)/python -m compileall -q -j 0 apps_registry messaging presence analytics platform bench > /dev/null
test: install sysdeps $(NODE_STAMP)
	$(COMPILE)
	$(BIN)/python -m pytest $(PYTEST_DIST) $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# Day-to-day: everything but the tests that start real processes or drive a browser.
test-fast: install
	$(COMPILE)
	$(BIN)/python -m pytest $(PYTEST_DIST) -m "not system and not browser" $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

stop:
	$(BIN)/python -m devstack.embedded stop

lint: install
	$(BIN)/ruff check .

# The platform (RELIABLE, FAST) against both relays (core and pub/sub layer), with server CPU per message.
# Defaults as target variables: `$(or $(RATES),a,b)` would split the list at its commas.
bench: RATES ?= 300,400,600,800,1000
bench: BENCH_TARGETS ?= platform-RELIABLE,platform-FAST,relay-core,relay-pubsub
bench: install
	$(BIN)/python -m bench.compare --start-platform --no-confirmation --connections 200 --rates $(RATES) --duration 20 --warmup 5 --processes 2 --drain 10 --targets $(BENCH_TARGETS) $(BENCH_ARGS)

clean: stop
	rm -rf var/
