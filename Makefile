# Switchboard: `make run` starts the platform, `make test` runs the suite. Nothing else is needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install sysdeps run test test-fast stop lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: install
	$(BIN)/python -m devstack.supervise

# What the tests need from the operating system (Chromium, a Java runtime for Spark): installed
# with apt-get when missing and we are root, else a one-line instruction and a stop.
sysdeps: install
	$(BIN)/python -m devstack.sysdeps chromium java

test: install sysdeps
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

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
