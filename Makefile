# Quick start: `make run` (set up, then the default job), `make test` (set up, then the suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint format-check bench system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# Debian packages the tests need (a real etcd server for the runtime's store, which `make run`'s
# launched job uses too; `ip` from iproute2 for the network-namespace hosts; chromium and its
# driver for the dashboard's browser test).
system-deps:
	@{ command -v etcd && command -v ip && command -v chromium && command -v chromedriver; } \
	  >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq etcd-server iproute2 \
	    chromium chromium-driver >/dev/null; }

run: setup system-deps
	mkdir -p out
	$(BIN)/liveput trace generate --nodes 32 --hours 12 --seed 0 -o out/default-trace.csv
	$(BIN)/liveput trace stats out/default-trace.csv
	$(BIN)/liveput trace plot out/default-trace.csv -o out/default-trace.png
	$(BIN)/liveput simulate --trace out/default-trace.csv -o out/simulation.json \
	  --report out/report
	$(BIN)/liveput stop docs/examples/local.yaml >/dev/null 2>&1 || true
	rm -rf out/local-job
	$(BIN)/liveput launch docs/examples/local.yaml --detach --json
	$(BIN)/liveput status docs/examples/local.yaml --watch
	$(BIN)/liveput status docs/examples/local.yaml --json > out/local-job-status.json
	$(BIN)/liveput stop docs/examples/local.yaml

# The linters first: ruff's rules, the type checker, and the layering of the packages
# (pyproject.toml configures all three).
lint: setup
	$(BIN)/ruff check
	$(BIN)/mypy
	$(BIN)/lint-imports

# The code as ruff's formatter writes it (line length 100, from pyproject.toml).
format-check: setup
	$(BIN)/ruff format --check

test: lint system-deps
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) out build *.egg-info src/*.egg-info
