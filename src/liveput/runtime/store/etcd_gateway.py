"""etcd's JSON gateway over kept-alive HTTP/1.1 connections, one per thread.

Every store operation on etcd is one POST of a JSON object to the gateway (``/v3/kv/range``,
``/v3/kv/txn``, ...), answered by one JSON object. A job's agents, coordinator and launcher make
about 200 of them a second; through ``etcd3gw``'s ``requests`` session each cost about 1 ms of
CPU in the client (the session merges settings, scans the environment for proxies and checks
certificate paths on every request) and 1.4 ms of wall time against a local etcd. Here a request
is written to its thread's socket in one ``sendall`` and its answer parsed by
:class:`http.client.HTTPResponse`: 0.25-0.29 ms of CPU, 0.75-1.04 ms of wall time (``python -m
bench store``, signed requests of one key).

A connection is kept for the next request of its thread. One that the server closed meanwhile
(an etcd restart) is found before it is written to and opened again; one that fails during a
request is closed, and the failure is :class:`GatewayUnreachable`, which the store retries.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from typing import Any

TRANSIENT_STATUS = frozenset({408, 503, 504})
"""HTTP statuses that say etcd could not answer now (a timeout, a member unavailable): retried
as a connection failure is."""


class GatewayUnreachable(Exception):
    """The request did not get an answer: no connection, a connection cut, a timeout, or a
    status in :data:`TRANSIENT_STATUS`."""


class GatewayRefused(Exception):
    """etcd answered the request with an error (its message is the exception's)."""


def _api_path(version: str) -> str:
    """The gateway's path prefix for etcd server version ``version`` (``3.4.23``): ``/v3/``
    since 3.4, ``/v3beta/`` in 3.3, ``/v3alpha/`` before."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        raise GatewayRefused(f"etcd answered an unknown version {version!r}") from None
    if major_minor >= (3, 4):
        return "/v3/"
    return "/v3beta/" if major_minor >= (3, 3) else "/v3alpha/"


class Gateway:
    """POSTs to one etcd's JSON gateway; each thread has a connection of its own."""

    def __init__(self, host_name: str, port: int, timeout_s: float) -> None:
        self._address = (host_name, port)
        self._host_header = f"[{host_name}]:{port}" if ":" in host_name else f"{host_name}:{port}"
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._api: str | None = None

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """etcd's answer to ``payload`` POSTed to ``path`` (``kv/range``)."""
        if self._api is None:
            self._api = _api_path(str(self._request("GET", "/version", b"").get("etcdserver")))
        return self._request("POST", self._api + path, json.dumps(payload).encode())

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            sock.close()

    def _request(self, method: str, path: str, body: bytes) -> dict[str, Any]:
        sock = self._connection()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        try:
            sock.sendall(head.encode("ascii") + body)
            response = http.client.HTTPResponse(sock, method=method)
            response.begin()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._drop(sock)
            raise GatewayUnreachable(str(exc) or type(exc).__name__) from None
        if response.will_close:
            self._drop(sock)
        if response.status in TRANSIENT_STATUS:
            raise GatewayUnreachable(f"HTTP {response.status} {response.reason}")
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if response.status != 200:
            message = answer.get("message") or answer.get("error")
            raise GatewayRefused(str(message or f"HTTP {response.status} {response.reason}"))
        return answer

    def _connection(self) -> socket.socket:
        """This thread's connection, opened again if the server closed it since its last
        request (it is readable then: the end of the stream, or bytes no request asked for)."""
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is not None and sock.fileno() >= 0:
            waiting = select.poll()  # not select.select: a process may hold over 1024 files
            waiting.register(sock, select.POLLIN)
            if not waiting.poll(0):
                return sock
            self._drop(sock)
        try:
            sock = socket.create_connection(self._address, timeout=self._timeout_s)
        except OSError as exc:
            raise GatewayUnreachable(str(exc) or type(exc).__name__) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._open.add(sock)
        self._local.sock = sock
        return sock

    def _drop(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        sock.close()
        if getattr(self._local, "sock", None) is sock:
            self._local.sock = None
