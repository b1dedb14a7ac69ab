"""The etcd store's HTTP client (:mod:`liveput.runtime.store.etcd_gateway`): a connection kept
per thread and reused, one the server closed opened again without a failed request, transient
answers told from refusals; and against the real etcd, a refusal in etcd's own words."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import pytest

from liveput.errors import LiveputError
from liveput.runtime.store import open_store
from liveput.runtime.store.etcd_gateway import Gateway, GatewayRefused, GatewayUnreachable


@dataclass
class _Server:
    """An HTTP/1.1 server answering each request from ``answers`` (status, JSON body; the
    version request always), counting the connections it accepted; with ``close_after`` it
    closes a connection after that many answers, without saying so in a header."""

    answers: list[tuple[int, dict]] = field(default_factory=list)
    close_after: int | None = None
    accepted: int = 0
    paths: list[str] = field(default_factory=list)
    closed: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    """Released as each connection is closed."""
    listener: socket.socket = field(default_factory=socket.socket)

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn, reader:
            self._serve(conn, reader)
        self.closed.release()

    def _serve(self, conn: socket.socket, reader: BinaryIO) -> None:
        answered = 0
        while self.close_after is None or answered < self.close_after:
            line = reader.readline()
            if not line:
                return
            method, path, _ = line.decode().split(" ", 2)
            length = 0
            while (header := reader.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            reader.read(length)
            self.paths.append(path)
            if method == "GET":
                status, body = 200, {"etcdserver": "3.4.23"}
            else:
                status, body = self.answers.pop(0) if self.answers else (200, {})
            data = json.dumps(body).encode()
            head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(data)}\r\n\r\n"
            conn.sendall(head.encode() + data)
            answered += 1


@pytest.fixture
def server() -> Iterator[_Server]:
    fake = _Server()
    fake.listener.bind(("127.0.0.1", 0))
    fake.listener.listen()
    thread = threading.Thread(target=fake.serve, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.listener.close()


def _gateway(server: _Server) -> Gateway:
    return Gateway("127.0.0.1", server.listener.getsockname()[1], timeout_s=5.0)


@pytest.mark.process
def test_a_thread_reuses_its_connection_and_each_thread_has_its_own(server: _Server) -> None:
    gateway = _gateway(server)
    server.answers = [(200, {"n": n}) for n in range(5)]
    assert [gateway.post("kv/range", {})["n"] for _ in range(3)] == [0, 1, 2]
    assert server.accepted == 1 and server.paths == ["/version", *["/v3/kv/range"] * 3]
    other = threading.Thread(target=gateway.post, args=("kv/put", {}))
    other.start()
    other.join()
    assert server.accepted == 2
    gateway.close()
    assert gateway.post("kv/range", {})["n"] == 4 and server.accepted == 3


@pytest.mark.process
def test_a_connection_the_server_closed_is_opened_again_without_a_failed_request(
    server: _Server,
) -> None:
    server.close_after = 2
    gateway = _gateway(server)
    server.answers = [(200, {"n": n}) for n in range(4)]
    answers = [gateway.post("kv/range", {})["n"]]
    # Each next request goes once the server has closed the connection, as to an idle one.
    assert server.closed.acquire(timeout=10)
    answers += [gateway.post("kv/range", {})["n"] for _ in range(2)]
    assert server.closed.acquire(timeout=10)
    answers.append(gateway.post("kv/range", {})["n"])
    assert answers == [0, 1, 2, 3]
    assert server.accepted == 3  # the version and one request, then two and two


@pytest.mark.process
def test_transient_answers_are_unreachable_and_others_refused_in_etcds_words(
    server: _Server,
) -> None:
    gateway = _gateway(server)
    server.answers = [
        (503, {}),
        (400, {"error": "etcdserver: mvcc: required revision is a future revision"}),
        (500, {}),
    ]
    with pytest.raises(GatewayUnreachable, match="503"):
        gateway.post("kv/range", {})
    with pytest.raises(GatewayRefused, match="^etcdserver: mvcc: required revision is a future"):
        gateway.post("kv/compaction", {})
    with pytest.raises(GatewayRefused, match="HTTP 500"):
        gateway.post("kv/range", {})


@pytest.mark.process
def test_nothing_listening_is_unreachable() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(GatewayUnreachable, match="refused"):
        Gateway("127.0.0.1", port, timeout_s=1.0).post("kv/range", {})


def test_a_real_etcd_refusal_is_one_line_naming_the_store_and_etcds_reason(etcd_url: str) -> None:
    store = open_store(etcd_url, timeout_s=5)
    with pytest.raises(LiveputError, match="failed: etcdserver: mvcc: required revision is a f"):
        store._post("kv/compaction", {"revision": 10**12})
    store.close()
    with pytest.raises(LiveputError, match="is closed"):
        store.get("k")
