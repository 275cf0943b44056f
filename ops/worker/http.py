"""The worker's one HTTP port: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``.

Rules
- Served by a ``ThreadingHTTPServer`` in a daemon thread; it only reads thread-safe state
  (the Prometheus registry, ``ReadinessHolder``, ``LoopHeartbeat``) and never touches the
  consumer, the lifecycle or the store.
- ``/healthz``: 200 while the process loop beats within its bound, else 503.
- ``/readyz``: 200 only in phase ``ready`` (see ``consumer.observability.readiness``), else 503.
- Both answer JSON; ``/metrics`` answers the Prometheus text format.
- Binds loopback by default; port 0 picks a free port (``HttpServer.port`` tells which).
- A client that hangs up before the answer is written (a scraper past its timeout) is not an
  error: nothing is printed; any other failure of a request prints its traceback to stderr.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from consumer.observability.readiness import LoopHeartbeat, ReadinessHolder

__all__ = ["HttpServer", "start_http_server"]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            body = self.server.heartbeat.as_dict()
            self._json(200 if body["healthy"] else 503, body)
        elif path == "/readyz":
            state = self.server.readiness.state
            self._json(200 if state.ready else 503, state.as_dict())
        else:
            self._json(404, {"error": "not found", "paths": ["/metrics", "/healthz", "/readyz"]})

    def _json(self, code: int, body: dict[str, object]) -> None:
        self._send(code, json.dumps(body).encode() + b"\n", "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None  # probes every few seconds would flood the log


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    readiness: ReadinessHolder
    heartbeat: LoopHeartbeat

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # broken pipe, reset: it hung up
            return
        super().handle_error(request, client_address)


class HttpServer:
    """A running server; ``close()`` stops it and joins its thread."""

    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self, *, timeout_s: float = 5.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)


def start_http_server(
    *,
    registry: CollectorRegistry,
    readiness: ReadinessHolder,
    heartbeat: LoopHeartbeat,
    host: str = "127.0.0.1",
    port: int = 0,
) -> HttpServer:
    """Bind ``host:port`` and serve in a daemon thread; raises ``OSError`` if the bind fails."""
    server = _Server((host, port), _Handler)
    server.registry = registry
    server.readiness = readiness
    server.heartbeat = heartbeat
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="fence-http", daemon=True
    )
    thread.start()
    return HttpServer(server, thread)
