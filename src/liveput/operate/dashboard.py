"""The live dashboard: one self-contained HTML page, its JSON, and Prometheus' ``/metrics``.

Served by the process that runs the coordinator, from the store alone (as ``liveput status``).
Paths: ``/`` (the page: plain JavaScript polls ``api/status`` and redraws its SVG plots in
place, nothing fetched from elsewhere), ``/api/status`` (the status with its last events),
``/api/series`` (the plotted points), ``/metrics`` (Prometheus). A request from loopback needs
nothing; from anywhere else it needs the job token (``?token=...`` or ``Authorization: Bearer``).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from liveput.errors import LiveputError
from liveput.runtime.store import Store, open_store

LOG = logging.getLogger(__name__)


def page_html() -> bytes:
    return resources.files("liveput.operate").joinpath("dashboard.html").read_bytes()


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Dashboard:
    """Binds at construction (a port in use is a one-line error before the job starts);
    :meth:`serve` starts answering once the job's store is known."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.store: Store | None = None
        self.token = ""
        self._lock = threading.Lock()
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                LOG.debug("dashboard: " + format, *args)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                dashboard._answer(self)

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as error:
            raise LiveputError(
                f"dashboard: cannot listen on {host}:{port}: "
                f"{(error.strerror or str(error)).lower()}"
            ) from None
        self.server.daemon_threads = True
        self.host = host
        self.port = self.server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}/"

    def serve(self, store_url: str, token: str) -> None:
        """Start answering, reading the job's status from the store at ``store_url``."""
        self.store = open_store(store_url, token=token, timeout_s=5.0)
        self.token = token
        self._thread = threading.Thread(
            target=self.server.serve_forever, daemon=True, name="dashboard"
        )
        self._thread.start()

    def _allowed(self, request: BaseHTTPRequestHandler, query: dict) -> bool:
        if _loopback(request.client_address[0]):
            return True
        given = (query.get("token") or [""])[0]
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = header.removeprefix("Bearer ").strip()
        return bool(self.token) and hmac.compare_digest(given.encode(), self.token.encode())

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        from liveput.operate.metrics import prometheus_text
        from liveput.operate.recorder import read_series, read_status

        parts = urlsplit(request.path)
        if not self._allowed(request, parse_qs(parts.query)):
            self._send(
                request, HTTPStatus.UNAUTHORIZED, b"the job token is required\n", "text/plain"
            )
            return
        try:
            with self._lock:  # one store connection, shared by the server's threads
                assert self.store is not None
                if parts.path == "/":
                    body, kind = page_html(), "text/html; charset=utf-8"
                elif parts.path == "/api/status":
                    body = json.dumps(read_status(self.store, events=20)).encode()
                    kind = "application/json"
                elif parts.path == "/api/series":
                    body, kind = json.dumps(read_series(self.store)).encode(), "application/json"
                elif parts.path == "/metrics":
                    body, kind = prometheus_text(self.store), "text/plain; version=0.0.4"
                else:
                    self._send(request, HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
                    return
        except LiveputError as error:
            self._send(request, HTTPStatus.SERVICE_UNAVAILABLE, f"{error}\n".encode(), "text/plain")
            return
        self._send(request, HTTPStatus.OK, body, kind)

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: HTTPStatus, body: bytes, kind: str) -> None:
        try:
            request.send_response(status)
            request.send_header("Content-Type", kind)
            request.send_header("Content-Length", str(len(body)))
            request.send_header("Cache-Control", "no-store")
            request.end_headers()
            request.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def close(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
        self.server.server_close()
        with self._lock:
            if self.store is not None:
                self.store.close()
