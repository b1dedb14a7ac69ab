"""The one opener of a job's store (launch.job_store): a store hosted here, one named by URL and
waited for, and what it refuses."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from liveput.errors import LiveputError
from liveput.launch.job_store import StorePlace, open_job_store
from liveput.ports import free_port_pair
from liveput.runtime.store import open_store


def test_a_hosted_store_gives_the_url_agents_reach_it_at_and_signs_its_values():
    with open_job_store(StorePlace("tcp://127.0.0.1:0", host=True), "job-token") as opened:
        assert opened.url.startswith("tcp://127.0.0.1:") and not opened.url.endswith(":0")
        assert opened.etcd is None
        opened.store.set("k", b"v")
        with open_store(opened.url, token="job-token", timeout_s=5.0) as agent:
            assert agent.get("k") == b"v"
        with open_store(opened.url, token="another", timeout_s=5.0) as stranger:
            with pytest.raises(LiveputError, match="sign"):
                stranger.get("k")


def test_a_named_store_not_up_is_waited_for_then_given_up_in_one_line():
    port = free_port_pair()
    started = time.monotonic()
    with pytest.raises(LiveputError, match="unreachable"):
        open_job_store(StorePlace(f"tcp://127.0.0.1:{port}", wait_s=1.0, timeout_s=0.2), "t")
    assert time.monotonic() - started < 10.0


def test_a_place_is_one_of_a_url_and_an_etcd():
    from liveput.runtime.store.etcd_server import EtcdConfig

    with pytest.raises(ValueError, match="one of them"):
        StorePlace()
    with pytest.raises(ValueError, match="one of them"):
        StorePlace("tcp://h:1", etcd=EtcdConfig(directory=Path("x")))
    with pytest.raises(ValueError, match="wait_s"):
        StorePlace("tcp://h:1", wait_s=-1.0)
