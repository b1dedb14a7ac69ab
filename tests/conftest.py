"""Shared test fixtures, and the two tiers of the suite.

Tiers: a test that starts a process, a server or a socket (agent processes, a real etcd, network
namespaces, a TCP store, gloo groups, moto or an HTTP server) is marked ``process``; every other
test is the unit tier, ``make test-unit`` (``pytest -m "not process"``). A fixture that starts
one requests :func:`process_tier`, so that every test using it is marked here without a mark of
its own; a test that starts one itself carries ``@pytest.mark.process``, and the modules whose
every test does are listed in ``PROCESS_MODULES``.
"""

from __future__ import annotations

import os
from pathlib import Path

# One intra-op thread in every test process and every process a test starts (this environment
# is theirs), before torch is first imported: make test runs three workers on two cores, and
# torch's default of a thread per core had its idle threads spin, waiting for the next parallel
# region, on cores the other processes needed (a tiny-gpt reference run of 12 steps beside two
# busy processes: 17.7 CPU-s and 18.4 s with two threads, 4.8 CPU-s and 7.8 s with one). The
# agents, the profiler and the peers already train on one thread each.
os.environ["OMP_NUM_THREADS"] = "1"

# The tests' folder on the module path of every process a test starts: the jobs its agents and
# coordinators train live here (``runtime_cluster:slow_small_job``). A test process's agents then
# all start alike, so that the jobs it runs share one fork server (liveput.cloud.agent_forks:
# with the folder added for some of them only, a worker started two, 4 CPU-s each).
TESTS = str(Path(__file__).resolve().parent)
_PATH = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
if _PATH[:1] != [TESTS]:  # xdist's workers inherit it from the session's process
    os.environ["PYTHONPATH"] = os.pathsep.join([TESTS, *_PATH])

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# No wall-clock limit on a hypothesis example or on drawing one: `make test` runs the unit tier
# at the lowest priority beside the process tests, where a test may wait for a core for a while.
# What a property test asserts is the property, not how fast an example ran.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

torch.set_num_threads(1)

# The runtime's server fixtures (a real etcd, network-namespace hosts), shared by the test files.
from runtime_fixtures import etcd_server, etcd_url, netns_hosts  # noqa: E402, F401

DATA = Path(__file__).resolve().parents[1] / "data"
"""The repository's committed real data (``data/README.md`` names the public sources)."""


@pytest.fixture(scope="session")
def process_tier() -> None:
    """Requested by the fixtures that start a process, a server or a socket: the tests that
    use them (directly or through another fixture) are marked ``process``."""


PROCESS_MODULES = frozenset(
    {
        "test_bench_gpu.py",  # every part of bench gpu runs in a process of its own
        "test_models_training.py",  # gloo groups in threads; `liveput train`'s agents
        "test_runtime_deadline.py",  # `liveput train`: its store server and agents
        "test_runtime_exit.py",  # child interpreters ending with a TCPStore
        "test_runtime_netns.py",  # agents on network-namespace hosts
        "test_runtime_recovery.py",  # coordinators, agents and etcd restarted
        "test_runtime_train.py",  # `liveput train` end to end
    }
)
"""Test modules whose every test starts processes, servers or sockets."""


SERIAL_MODULES = frozenset(
    {"test_runtime_abort.py", "test_runtime_chaos.py", "test_runtime_deadline.py"}
)
"""The modules that hold the ``serial`` tests. ``make test``'s serial session (``-m serial``)
collects only these (each worker imports the modules it collects: about 8 CPU-s for the whole
suite); a ``serial`` test elsewhere is refused at collection, so that none is left out."""


LONGEST_FIRST = (
    "test_runtime_faults.py",
    "test_operate_job.py",
    "test_runtime_recovery.py",
    "test_cli_docs.py",
    "test_deadline_resume.py",
    "test_forecast.py",
    "test_readme_own_model.py",
    "test_bench_peers_hosts.py",
    "test_runtime_store.py",
    "test_bench_gpu.py",
    "test_cli_hostile.py",
    "test_cli_provider.py",
    "test_models_reference.py",
    "test_cloud_aws.py",
    "test_models_training.py",
    "test_bench_peers_fsdp.py",
    "test_runtime_netns.py",
    "test_instance_memory.py",
    "test_cloud_agent_forks.py",
    "test_runtime_operate.py",
    "test_deadline.py",
    "test_perf_model.py",
)
"""The suite's longest test files (80 s down to 12 s each under ``make test``'s load), collected
first, longest first: the Makefile has pytest-xdist hand a worker a file at a time in
collection order (``--no-loadscope-reorder``), and the longest handed out last made the run's
tail (the process tier took 381 s without this order and 336 s with it, on 927-975 s of tests;
with files of 16-25 s left out of it, one of them made the last 10-15 s of a session, one core
idle). ``test_forecast.py`` is the unit tier's longest (about 19 CPU-s)."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the serial session, every test module but the serial ones is left uncollected."""
    if (
        config.getoption("markexpr") == "serial"
        and collection_path.suffix == ".py"
        and collection_path.name.startswith("test_")
        and collection_path.name not in SERIAL_MODULES
    ):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    missing = sorted(
        name
        for name in PROCESS_MODULES | SERIAL_MODULES | set(LONGEST_FIRST)
        if not (here / name).is_file()
    )
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: names no test file {missing}")
    stray = sorted(
        item.nodeid
        for item in items
        if item.get_closest_marker("serial") and item.path.name not in SERIAL_MODULES
    )
    if stray:
        raise pytest.UsageError(f"serial tests outside tests/conftest.py's SERIAL_MODULES: {stray}")
    for item in items:
        if item.path.name in PROCESS_MODULES or "process_tier" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.process)
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def real_traces() -> Path:
    """The folder of the real measured spot traces committed in the repository."""
    return DATA / "traces"
