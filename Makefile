# Quick start: `make run` (set up, then the default job), `make test` (set up, then the suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test bench system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# Debian packages the tests need (a real etcd server for the runtime's store tests; `ip` from
# iproute2 for the network-namespace hosts).
system-deps:
	@{ command -v etcd && command -v ip; } >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq etcd-server iproute2 >/dev/null; }

run: setup
	mkdir -p out
	$(BIN)/liveput trace generate --nodes 32 --hours 12 --seed 0 -o out/default-trace.csv
	$(BIN)/liveput trace stats out/default-trace.csv
	$(BIN)/liveput trace plot out/default-trace.csv -o out/default-trace.png
	$(BIN)/liveput simulate --trace out/default-trace.csv -o out/simulation.json \
	  --report out/report

test: setup system-deps
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) out build *.egg-info src/*.egg-info
