"""The store contract, run against the in-memory fake, PyTorch's TCPStore and a real etcd server."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
from runtime_fixtures import EtcdServer, NetnsHosts, free_port
from torch.distributed import PrefixStore

from liveput.errors import LiveputError
from liveput.runtime.store import (
    EtcdStore,
    MemoryStore,
    SignedStore,
    Store,
    TCPStoreBackend,
    open_store,
)

BACKENDS = [
    "memory",
    pytest.param("tcp", marks=pytest.mark.process),
    pytest.param("etcd", marks=pytest.mark.process),
]
"""The TCP and etcd backends are servers: their cases are in the process tier."""


@pytest.fixture
def tcp_host(process_tier: None) -> Iterator[Store]:
    """A TCPStore server hosted in this process on a free loopback port."""
    host = open_store("tcp://127.0.0.1:0", host=True, timeout_s=5)
    yield host
    host.close()


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A client of each backend; for TCP a separate connection to a store hosted here."""
    if request.param == "memory":
        opened = open_store("memory://")
    elif request.param == "tcp":
        host = request.getfixturevalue("tcp_host")
        opened = open_store(host.url, timeout_s=5)
    else:
        opened = open_store(request.getfixturevalue("etcd_url"), timeout_s=5)
    yield opened
    opened.close()


# -- the contract ----------------------------------------------------------------------------------


def test_get_set_roundtrip_binary_and_empty_values(store: Store) -> None:
    assert store.get("a/missing") is None
    payload = bytes(range(256))
    store.set("a/bin", payload)
    store.set("a/empty", b"")
    store.set("a/ünï", b"x")
    assert store.get("a/bin") == payload
    assert store.get("a/empty") == b""
    assert store.get("a/ünï") == b"x"
    store.set("a/bin", b"second")
    assert store.get("a/bin") == b"second"


def test_compare_and_set_semantics(store: Store) -> None:
    assert store.compare_and_set("k", None, b"one") is True
    assert store.compare_and_set("k", None, b"two") is False  # exists: create-only fails
    assert store.get("k") == b"one"
    assert store.compare_and_set("k", b"wrong", b"two") is False
    assert store.get("k") == b"one"
    assert store.compare_and_set("k", b"one", b"two") is True
    assert store.get("k") == b"two"
    assert store.compare_and_set("absent", b"two", b"x") is False
    assert store.get("absent") is None
    # A rewrite of the same value leaves the CAS on that value valid.
    store.set("k", b"two")
    assert store.compare_and_set("k", b"two", b"three") is True
    assert store.compare_and_set("empty", None, b"") is True
    assert store.compare_and_set("empty", b"", b"filled") is True
    assert store.get("empty") == b"filled"


def test_delete_and_prefix_listing(store: Store) -> None:
    for key in ["members/a", "members/b", "members/c", "membersx", "plan"]:
        store.set(key, key.encode())
    store.delete("members/b")
    store.delete("members/never-existed")
    assert store.get("members/b") is None
    assert store.get_prefix("members/") == {"members/a": b"members/a", "members/c": b"members/c"}
    assert set(store.get_prefix("")) == {"members/a", "members/c", "membersx", "plan"}
    assert store.get_prefix("nothing/") == {}
    assert (
        store.compare_and_set("members/b", None, b"again") is True
    )  # deleted keys can be re-created


def test_add_is_a_counter(store: Store) -> None:
    assert store.add("step", 1) == 1
    assert store.add("step", 5) == 6
    assert store.add("step", -2) == 4
    assert store.get("step") == b"4"
    store.set("preset", b"10")
    assert store.add("preset", 1) == 11
    store.set("text", b"hello")
    with pytest.raises(LiveputError, match="not an integer"):
        store.add("text", 1)


def test_wait_for_returns_value_set_later_and_times_out(store: Store) -> None:
    timer = threading.Timer(0.2, store.set, args=("ready", b"go"))
    timer.start()
    try:
        assert store.wait_for("ready", 5.0) == b"go"
    finally:
        timer.join()
    started = time.monotonic()
    with pytest.raises(LiveputError, match="timed out.*'never'"):
        store.wait_for("never", 0.3)
    assert 0.25 <= time.monotonic() - started < 3.0


def test_bad_keys_and_values_are_refused(store: Store) -> None:
    with pytest.raises(LiveputError, match="bytes"):
        store.set("k", "text")  # type: ignore[arg-type]
    with pytest.raises(LiveputError, match="key"):
        store.get("")


def test_closed_store_refuses(store: Store) -> None:
    store.close()
    with pytest.raises(LiveputError, match="closed"):
        store.get("k")
    store.close()  # idempotent


def test_cas_race_has_exactly_one_winner_and_no_lost_updates(store: Store) -> None:
    threads = 6
    barrier = threading.Barrier(threads)
    wins: list[bool] = []
    lock = threading.Lock()

    def create() -> None:
        barrier.wait()
        won = store.compare_and_set("leader", None, b"same")  # all write the same value
        with lock:
            wins.append(won)

    def increment_by_cas(rounds: int) -> None:
        barrier.wait()
        for _ in range(rounds):
            while True:
                current = store.get("count")
                new = str(int(current or b"0") + 1).encode()
                if store.compare_and_set("count", current, new):
                    break

    added: list[int] = []

    def increment_by_add(rounds: int) -> None:
        barrier.wait()
        for _ in range(rounds):
            value = store.add("counter", 1)
            with lock:
                added.append(value)

    for target, args in [(create, ()), (increment_by_cas, (10,)), (increment_by_add, (10,))]:
        pool = [threading.Thread(target=target, args=args) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(timeout=60)
        barrier.reset()
    assert sorted(wins) == [False] * (threads - 1) + [True]
    assert store.get("count") == str(threads * 10).encode()
    assert sorted(added) == list(range(1, threads * 10 + 1))


def test_random_operations_match_the_reference_model(store: Store) -> None:
    # A dict is the specification; 300 random operations over a few keys must agree with it.
    rng = random.Random(11)
    keys = ["a", "a/b", "a/c", "b", "ab"]
    values = [b"", b"0", b"7", b"x", b"\x00\xff", b"v" * 9]
    model: dict[str, bytes] = {}
    for step in range(300):
        op, key, value = rng.randrange(6), rng.choice(keys), rng.choice(values)
        where = f"step {step}: op {op} on {key!r}"
        if op == 0:
            store.set(key, value)
            model[key] = value
        elif op == 1:
            expected = rng.choice([None, model.get(key), rng.choice(values)])
            swapped = store.compare_and_set(key, expected, value)
            assert swapped == (model.get(key) == expected), where
            if swapped:
                model[key] = value
        elif op == 2:
            store.delete(key)
            model.pop(key, None)
        elif op == 3:
            prefix = rng.choice(["", "a", "a/", "b", "z"])
            assert store.get_prefix(prefix) == {
                k: v for k, v in model.items() if k.startswith(prefix)
            }, where
        elif op == 4:
            current = model.get(key, b"0")
            if current.lstrip(b"-").isdigit():
                amount = rng.choice([-3, -1, 1, 2, 5])
                assert store.add(key, amount) == int(current) + amount, where
                model[key] = str(int(current) + amount).encode()
            else:
                with pytest.raises(LiveputError, match="not an integer"):
                    store.add(key, 1)
        else:
            assert store.get(key) == model.get(key), where


# -- opening by URL --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h:1", "unknown scheme"),
        ("127.0.0.1:2379", "unknown scheme"),
        ("tcp://nohostport", "SCHEME://HOST:PORT"),
        ("etcd://host:notaport", "SCHEME://HOST:PORT"),
        ("tcp://host:99999", "SCHEME://HOST:PORT"),
    ],
)
def test_open_store_rejects_bad_urls(url: str, message: str) -> None:
    with pytest.raises(LiveputError, match=message):
        open_store(url)


def test_open_store_picks_backends_and_wraps_with_token(tcp_host: Store, etcd_url: str) -> None:
    assert isinstance(tcp_host, TCPStoreBackend) and tcp_host.port > 0
    assert isinstance(open_store("memory://"), MemoryStore)
    shared = open_store("memory://job1")
    assert open_store("memory://job1") is shared
    assert open_store("memory://") is not open_store("memory://")
    etcd = open_store(etcd_url, host=True)
    assert isinstance(etcd, EtcdStore)
    etcd.close()
    signed = open_store("memory://", token="secret")
    assert isinstance(signed, SignedStore)


@pytest.mark.process
def test_unreachable_stores_name_their_url() -> None:
    port = free_port()
    with pytest.raises(LiveputError, match=f"tcp://127.0.0.1:{port} unreachable"):
        open_store(f"tcp://127.0.0.1:{port}", timeout_s=0.5)
    with pytest.raises(LiveputError, match=f"etcd://127.0.0.1:{port} unreachable"):
        open_store(f"etcd://127.0.0.1:{port}", timeout_s=0.5)


def test_tcp_host_on_a_busy_port_says_so(tcp_host: TCPStoreBackend) -> None:
    with pytest.raises(LiveputError, match=f"store {tcp_host.url}: cannot listen: .*in use"):
        open_store(tcp_host.url, host=True)


def test_tcp_host_listens_only_on_the_address_asked(tcp_host: TCPStoreBackend) -> None:
    # 127.0.0.2 is loopback too; a server bound to every interface would answer there.
    with pytest.raises(LiveputError, match="unreachable"):
        open_store(f"tcp://127.0.0.2:{tcp_host.port}", timeout_s=0.5)
    assert open_store(f"tcp://127.0.0.1:{tcp_host.port}", timeout_s=2).get("x") is None


def test_tcp_clients_share_the_hosted_state(tcp_host: TCPStoreBackend) -> None:
    client = open_store(tcp_host.url, timeout_s=5)
    client.set("plan", b"D=2,P=3")
    assert tcp_host.get("plan") == b"D=2,P=3"
    assert tcp_host.compare_and_set("plan", b"D=2,P=3", b"D=1,P=6")
    assert client.get("plan") == b"D=1,P=6"
    # The raw TCPStore is there for torch.distributed (process groups), in its own key space.
    pg_store = PrefixStore("pg/0", tcp_host.torch_store)
    pg_store.set("rank0", "addr")
    assert client.get("pg/0/rank0") == b"addr"  # foreign values come back raw
    # Listings show what this contract wrote (its index), not torch's own keys.
    assert client.get_prefix("pg/0/") == {}
    assert client.get_prefix("") == {"plan": b"D=1,P=6"}
    del pg_store  # the hosted server lives while anything holds the torch store
    tcp_host.close()
    with pytest.raises(LiveputError, match=tcp_host.url):
        client.get("plan")  # the coordinator hosting the store is gone


# -- etcd restart ----------------------------------------------------------------------------------


def test_etcd_restart_keeps_data_and_clients_reconnect(
    etcd_server: EtcdServer, etcd_url: str
) -> None:
    store = open_store(etcd_url, timeout_s=15)
    store.set("committed_step", b"41")
    assert store.add("epoch", 1) == 1
    etcd_server.stop(kill=True)  # a crash, not a clean shutdown
    outcome: dict[str, object] = {}

    def write_while_down() -> None:
        try:
            outcome["added"] = store.add("epoch", 1)
        except LiveputError as exc:
            outcome["error"] = exc

    writer = threading.Thread(target=write_while_down)
    writer.start()
    time.sleep(0.5)
    assert writer.is_alive(), "the client should keep retrying while etcd is down"
    etcd_server.start()
    writer.join(timeout=20)
    assert outcome == {"added": 2}
    assert store.get("committed_step") == b"41"
    assert store.compare_and_set("committed_step", b"41", b"42")
    assert open_store(etcd_url).get("committed_step") == b"42"


def test_etcd_counters_and_cas_are_exactly_once_across_restarts(
    etcd_server: EtcdServer, etcd_url: str
) -> None:
    """A request etcd applied but whose reply the restart cut off is retried: the retry must not
    apply it twice (a commit vote counted twice would leave a step that never commits)."""
    store = open_store(etcd_url, timeout_s=30)
    returned: list[int] = []
    won: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def client(index: int) -> None:
        own = open_store(etcd_url, timeout_s=30)
        try:
            for n in range(100_000):
                if stop.is_set():
                    return
                returned.append(own.add("votes", 1))
                key = f"once/{index}/{n}"
                if own.compare_and_set(key, None, b"1"):
                    won.append(key)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for round_ in range(6):
        time.sleep(0.7)
        etcd_server.restart(kill=round_ % 2 == 1, down_s=0.2)
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(returned) > 50
    # Every add returned its own value, and the counter holds exactly the adds made.
    assert sorted(returned) == list(range(1, len(returned) + 1))
    assert int(store.get("votes")) == len(returned)
    # Each compare-and-set of a new key said True exactly once, and nothing else wrote one.
    assert sorted(won) == sorted(store.get_prefix("once/"))


def test_etcd_outage_longer_than_timeout_is_a_one_line_error(
    etcd_server: EtcdServer, etcd_url: str
) -> None:
    store = open_store(etcd_url, timeout_s=0.5)
    etcd_server.stop()
    with pytest.raises(LiveputError, match=f"{etcd_url} unreachable") as info:
        store.get("k")
    assert "\n" not in str(info.value)
    etcd_server.start()
    assert store.get("k") is None


# -- signatures ------------------------------------------------------------------------------------


def test_signed_store_roundtrip_and_refusals(store: Store) -> None:
    inner = store
    signed = SignedStore(inner, "job-token")
    signed.set("plan", b"D=2")
    assert signed.get("plan") == b"D=2"
    assert inner.get("plan") != b"D=2"  # carries a signature
    assert signed.compare_and_set("plan", b"D=2", b"D=3")
    assert signed.add("step", 2) == 2 and signed.add("step", 1) == 3
    assert signed.get_prefix("") == {"plan": b"D=3", "step": b"3"}
    assert signed.wait_for("plan", 1.0) == b"D=3"

    # A peer without the token writes raw values: refused.
    inner.set("forged", b"D=99")
    with pytest.raises(LiveputError, match="^refused: .*'forged'.*not signed"):
        signed.get("forged")
    # A listing leaves the forged entry out instead of failing, so it cannot hide the others.
    assert signed.get_prefix("") == {"plan": b"D=3", "step": b"3"}
    with pytest.raises(LiveputError, match="^refused"):
        signed.add("forged", 1)
    # Tampering with a signed value: refused.
    raw = inner.get("plan")
    assert raw is not None
    inner.set("plan", raw[:-1] + b"9")
    with pytest.raises(LiveputError, match="^refused: .*bad signature"):
        signed.get("plan")
    # A signed value moved to another key: refused (the MAC covers the key).
    inner.set("moved", raw)
    with pytest.raises(LiveputError, match="^refused"):
        signed.get("moved")


def test_signed_store_with_wrong_token_is_refused(store: Store) -> None:
    inner = store
    ours = SignedStore(inner, "right-token")
    theirs = SignedStore(inner, "wrong-token")
    ours.set("members/a", b"alive")
    with pytest.raises(LiveputError, match="^refused: .*bad signature"):
        theirs.get("members/a")
    assert theirs.compare_and_set("members/a", b"alive", b"hijacked") is False
    assert ours.get("members/a") == b"alive"
    theirs.set("members/b", b"intruder")
    with pytest.raises(LiveputError, match="^refused"):
        ours.get("members/b")
    with pytest.raises(LiveputError, match="^refused"):
        ours.wait_for("members/b", 0.5)
    with pytest.raises(LiveputError, match="token"):
        SignedStore(inner, "")


# -- across network namespaces ---------------------------------------------------------------------

_NETNS_HOST = textwrap.dedent(
    """
    import sys
    from liveput.runtime.store import open_store
    store = open_store(sys.argv[1], host=True, token="tok", timeout_s=20)
    store.set("hello", b"from-host")
    print(store.wait_for("reply", 20).decode(), store.get("counter").decode(), flush=True)
    store.close()
    """
)
_NETNS_CLIENT = textwrap.dedent(
    """
    import sys
    from liveput.runtime.store import open_store
    store = open_store(sys.argv[1], token="tok", timeout_s=20)
    greeting = store.wait_for("hello", 20)
    store.add("counter", 7)
    store.set("reply", b"client-saw-" + greeting)
    """
)


def test_tcp_store_reached_across_network_namespaces(netns_hosts: NetnsHosts) -> None:
    url = f"tcp://{netns_hosts.address(0)}:29400"
    host = netns_hosts.popen(
        0, [sys.executable, "-c", _NETNS_HOST, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        client = netns_hosts.run(1, [sys.executable, "-c", _NETNS_CLIENT, url], timeout_s=60)
        assert client.returncode == 0, client.stderr[-2000:]
        out, err = host.communicate(timeout=30)
    finally:
        host.kill()
        host.wait()
    assert host.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["client-saw-from-host", "7"]
    # The namespace-internal address does not exist outside the namespaces.
    with pytest.raises(LiveputError, match="unreachable"):
        open_store(url, timeout_s=0.3)


@pytest.mark.process
def test_a_client_waits_for_a_server_that_starts_late_and_gives_up_at_its_timeout() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(LiveputError, match=rf"tcp://127.0.0.1:{port} unreachable after 2 s"):
        TCPStoreBackend("127.0.0.1", port, timeout_s=2.0)
    # c10d alone retries once after a delay as long as the timeout: over 4 s for a 2-s timeout.
    assert time.monotonic() - started < 3.5
    hosted: list[TCPStoreBackend] = []
    later = threading.Timer(
        0.5, lambda: hosted.append(TCPStoreBackend("127.0.0.1", port, host=True))
    )
    later.start()
    client = TCPStoreBackend("127.0.0.1", port, timeout_s=10.0)  # refused at first
    later.join()
    client.set("k", b"v")
    assert hosted[0].get("k") == b"v"
    client.close()
    hosted[0].close()


def test_a_writer_killed_while_indexing_a_key_hides_no_later_key(tcp_host: Store) -> None:
    """The wipe-out stall of the noticeless benchmark: an agent SIGKILLed between counting its index
    entry and writing it left a hole, and the listing stopped there for good: instances that
    joined later were never seen, and the job waited for instances that were up."""
    assert isinstance(tcp_host, TCPStoreBackend)
    tcp_host.set("members/1", b"a")
    assert set(tcp_host.get_prefix("members/")) == {"members/1"}
    # A dying writer's first call only: the entry is counted, never written.
    tcp_host.torch_store.add("__liveput_index__/count", 1)
    joiner = TCPStoreBackend("127.0.0.1", tcp_host.port, timeout_s=5.0)
    try:
        joiner.set("members/2", b"b")
        assert set(tcp_host.get_prefix("members/")) == {"members/1", "members/2"}
        # A slow writer's entry that comes after all is listed at the next look.
        entry = tcp_host.torch_store.add("__liveput_index__/count", 1)
        joiner.set("members/3", b"c")
        assert set(tcp_host.get_prefix("members/")) == {"members/1", "members/2", "members/3"}
        tcp_host.torch_store.set(f"__liveput_index__/{entry}", b"members/4")
        joiner.set("members/4", b"d")
        assert set(tcp_host.get_prefix("members/")) == {f"members/{i}" for i in range(1, 5)}
    finally:
        joiner.close()


class _Killed(BaseException):
    """The writer dies here (as a SIGKILL would end it: nothing after runs)."""


class _DiesRightAfterItsWrite(TCPStoreBackend):
    """A client whose process is killed the moment its write of a key has landed."""

    def _swap(self, key: str, expected_raw: bytes | None, new_raw: bytes) -> bytes:
        result = super()._swap(key, expected_raw, new_raw)
        if not key.startswith("__liveput_index__/"):
            raise _Killed(key)
        return result


@pytest.mark.parametrize("write", ["compare_and_set", "add"])
def test_a_writer_killed_right_after_its_write_leaves_the_key_listed(
    tcp_host: Store, write: str
) -> None:
    """The lost ledger record of a CI run: the agent whose compare-and-set created
    ``ledger/2/124`` was SIGKILLed before it indexed the key; the other writers lost the CAS and
    indexed nothing, so the step, applied everywhere, was missing from every listing. Keys are
    indexed before the write that may create them."""
    assert isinstance(tcp_host, TCPStoreBackend)
    dying = _DiesRightAfterItsWrite("127.0.0.1", tcp_host.port, timeout_s=5.0)
    try:
        with pytest.raises(_Killed):
            if write == "add":
                dying.add("hb/7", 1)
            else:
                dying.compare_and_set("ledger/2/124", None, b"record")
    finally:
        dying.close()
    key = "hb/7" if write == "add" else "ledger/2/124"
    assert tcp_host.get(key) is not None  # the write landed
    # A survivor's write of the same key loses the race (or adds to it) and lists it.
    if write == "add":
        assert tcp_host.add(key, 1) == 2
    else:
        assert not tcp_host.compare_and_set(key, None, b"record")
    assert set(tcp_host.get_prefix(key.rsplit("/", 1)[0] + "/")) == {key}
    reader = TCPStoreBackend("127.0.0.1", tcp_host.port, timeout_s=5.0)
    try:
        assert set(reader.get_prefix(key.rsplit("/", 1)[0] + "/")) == {key}
    finally:
        reader.close()


def test_a_key_indexed_before_its_write_is_listed_once_written(tcp_host: Store) -> None:
    """Indexed first, written after: a listing in between does not see it, and does not lose it
    either (its marker says a writer is at it), so the next listing does."""
    assert isinstance(tcp_host, TCPStoreBackend)
    tcp_host._register("ledger/0/5")
    reader = TCPStoreBackend("127.0.0.1", tcp_host.port, timeout_s=5.0)
    try:
        assert reader.get_prefix("ledger/") == {}
        tcp_host.set("ledger/0/5", b"r")
        assert reader.get_prefix("ledger/") == {"ledger/0/5": b"r"}
        tcp_host.delete("ledger/0/5")
        assert reader.get_prefix("ledger/") == {}
        tcp_host.set("ledger/0/5", b"again")  # written again after its delete: listed again
        assert reader.get_prefix("ledger/") == {"ledger/0/5": b"again"}
    finally:
        reader.close()
