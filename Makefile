# Quick start: `make run` (set up, then the default job), `make test` (set up, then the suite),
# `make test-unit` (the tests that start no process, server or socket: under a minute).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-unit lint lint-fast typecheck bench system-deps clean

# Python may cache the bytecode of liveput's own modules (__pycache__, ignored by git): the suite
# starts hundreds of agent and CLI processes, and an environment that forbids the cache made each
# one compile them again (about 0.5 CPU-s a process).
unexport PYTHONDONTWRITEBYTECODE

# uv installs the pinned packages: a fresh setup took it about 10 s, where pip took 25-35 (pip
# resolved and unpacked one wheel at a time). uv reads no pip configuration, so it is told where
# pip finds wheels beside its index (a machine may keep the CPU build of torch there). It
# compiles no bytecode: Python compiles the few thousand modules the suite imports as it first
# imports them (compiling all of them, torch's thousands among them, took most of a setup). It
# hardlinks the installed files to its cache (its default; a copy where the cache lies on another
# file system): copying them (torch's among them) took 11.5 s of an install where linking took 5.3.
# The environment is made without pip, and the machine's own pip puts uv into it (`pip --python`):
# venv's bundled pip took 4.2 s of every fresh setup to unpack, and installing uv with it 1.8 s
# more. Where the machine's Python has no pip, the bundled one is unpacked as before. uv then
# installs pip itself (pinned, the one Python 3.11 bundles) with the rest, for what runs
# `python -m pip` in the environment.
UV_VERSION := 0.13.9
PIP_VERSION := 23.2.1
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(BIN)/python install --quiet uv==$(UV_VERSION) 2>/dev/null \
	  || { $(BIN)/python -m ensurepip --upgrade >/dev/null \
	       && $(BIN)/python -m pip install --quiet uv==$(UV_VERSION); }
	find_links=$$({ $(PYTHON) -m pip config list || $(BIN)/python -m pip config list; } \
	  2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$$/\1/p" | head -n 1); \
	$(BIN)/uv pip install --quiet --python $(BIN)/python \
	  $${find_links:+--find-links "$$find_links"} -e '.[test]' pip==$(PIP_VERSION)
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

# The linters: ruff's rules and formatting and the layering of the packages, then the type
# checker (pyproject.toml configures all of them).
lint: lint-fast typecheck

lint-fast: setup
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# The tests' temporary files (their jobs' folders, etcd data and checkpoints) in memory where the
# machine has /dev/shm: etcd and the checkpoints sync every write to disk, and on a disk busy with
# the suite's own writes one sync took seconds.
TEST_TMPDIR := $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo $${TMPDIR:-/tmp})

# The tests marked `process` (tests/conftest.py marks them) left out: no system packages needed.
# They start nothing, so two workers (pytest-xdist, a file per worker) run them.
UNIT_PYTEST := $(BIN)/python -m pytest -q -m "not process" -n 2 --dist loadfile
UNIT_TESTS := TMPDIR=$(TEST_TMPDIR) $(UNIT_PYTEST)

# Every test. The Debian packages install in the background from the start (on a fresh machine
# apt-get took about 30 s, mostly waiting on downloads and the disk; in the foreground first where
# sudo would ask for a password), beside the Python setup, the fast linters and
# tests/warm_imports.py, which writes the bytecode the tests will need (two processes, a core
# each); the tests wait for both. Then three sessions, two of them at once:
# - The `process` tier's tests but the `serial` ones (agents, etcd, network namespaces, servers)
#   in three workers, a file per worker, the longest files first (tests/conftest.py orders them;
#   xdist would order files by their number of tests). Three on two cores: a third of their time
#   is waiting on the wall clock (a trace replayed, a notice's lead, a browser).
# - Beside it from the start, at the lowest priority, the unit tier (two workers) and the type
#   checker (one process, about 20 CPU-s): they take the moments the process tests leave a core
#   idle, and the process tests' wall-clock budgets are not theirs to eat into. Unit tests time
#   nothing on the wall clock that matters to them (tests/conftest.py turns off hypothesis's
#   per-example deadline). In one session of three workers beside the process tests, the unit
#   tests took a third of the cores at the process tests' expense, and the `serial` tier that
#   followed left a core idle most of its time: the suite took 5:43-6:01 where it took 5:25.
# - Last the `serial` ones, a file per core, while the unit tier still runs at the lowest
#   priority: they measure time against a budget of their own (heartbeat timeouts, a deadline
#   from a profile measured as the job starts, a fault campaign), which the other process tests'
#   load would eat into; beside one other (the campaign takes about 1.2 cores, the others about
#   one) the survivors left their collective 1.9-2.6 s after the fault, within the 5-s bound.
# A unit test's limit beside the process tiers: at the lowest priority a worker may get no core
# while they run (about five minutes; longer on a machine busy with other work), so its limit is
# what it may wait, not what it needs: one starved while importing torch beside the process tier
# on a loaded machine ran past pytest-timeout's 300 s. A hang still ends, and CI's own limit is
# 90 minutes.
STARVED_TIMEOUT_S := 1800

test:
	@deps_log=$$(mktemp); installed=0; deps=; \
	if [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then \
	  $(MAKE) --no-print-directory system-deps > $$deps_log 2>&1 & deps=$$!; \
	else $(MAKE) --no-print-directory system-deps || installed=$$?; fi; \
	$(MAKE) --no-print-directory lint-fast && $(BIN)/python tests/warm_imports.py; ready=$$?; \
	if [ -n "$$deps" ]; then wait $$deps || installed=$$?; fi; cat $$deps_log; rm -f $$deps_log; \
	[ $$ready -eq 0 ] && [ $$installed -eq 0 ]
	nice -n 19 $(BIN)/mypy > $(VENV)/typecheck.log 2>&1 & typecheck=$$!; \
	TMPDIR=$(TEST_TMPDIR) nice -n 19 $(UNIT_PYTEST) --timeout $(STARVED_TIMEOUT_S) \
	  --no-loadscope-reorder > $(VENV)/unit.log 2>&1 & \
	unit=$$!; \
	TMPDIR=$(TEST_TMPDIR) $(BIN)/python -m pytest -q -m "process and not serial" -n 3 \
	  --dist loadfile --no-loadscope-reorder --durations=12; processes=$$?; \
	TMPDIR=$(TEST_TMPDIR) $(BIN)/python -m pytest -q -m serial -n 2 --dist loadfile --durations=4; \
	serial=$$?; \
	wait $$unit; units=$$?; echo "unit tier:"; cat $(VENV)/unit.log; \
	wait $$typecheck; typed=$$?; cat $(VENV)/typecheck.log; \
	[ $$processes -eq 0 ] && [ $$serial -eq 0 ] && [ $$units -eq 0 ] && [ $$typed -eq 0 ]

test-unit: setup
	$(UNIT_TESTS)

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) out build *.egg-info src/*.egg-info
