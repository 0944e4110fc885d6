"""The consumer's HTTP server: `/metrics`, the Kubernetes probes, and the operator's nudge.

    GET  /metrics     Prometheus exposition (OpenMetrics when asked for)
    GET  /healthz     200 while the process is alive (and `live()` says so)
    GET  /readyz      200 when `ready()` says so (the ownership agent: registered, reading), else 503
    POST /assignment  202: the assignment changed, re-read it now (body optional: {"generation": N})

A `ThreadingHTTPServer` on a daemon thread: a slow scrape never holds up Spark or the ownership agent, and
nothing here blocks on them (the callbacks must be quick: read a flag, set an event). Bind to `0.0.0.0` in
a pod and `127.0.0.1` on a machine; port 0 picks a free port (`server.port` tells which).

Nothing sent to this port can change what a consumer owns: the nudge only makes it read the assignment
record from the store (the agent does so at most twice a second). Every read is bounded: a body only up to
`MAX_BODY_BYTES` with an exact `Content-Length` (no chunked bodies), and a connection idle for
`IDLE_TIMEOUT_SECONDS` is closed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hubshift.consumer.metrics import ConsumerMetrics
from hubshift.errors import UserError

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"
ASSIGNMENT_PATH = "/assignment"
MAX_BODY_BYTES = 4096
IDLE_TIMEOUT_SECONDS = 10.0

Probe = Callable[[], bool]
AssignmentNudge = Callable[[int | None], None]


class ConsumerHTTPServer:
    def __init__(
        self,
        metrics: ConsumerMetrics,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ready: Probe = lambda: False,
        live: Probe = lambda: True,
        on_assignment: AssignmentNudge | None = None,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.requested_port = port
        self.ready = ready
        self.live = live
        self.on_assignment = on_assignment
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ConsumerHTTPServer:
        handler = type("Handler", (_Handler,), {"owner": self})
        try:
            server = ThreadingHTTPServer((self.host, self.requested_port), handler)
        except OSError as exc:
            raise UserError(
                f"metrics port {self.requested_port} on {self.host or '0.0.0.0'}: {exc.strerror} "
                "(set consumer.metricsPort to a free port)"
            ) from None
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="hubshift-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> ConsumerHTTPServer:
        return self.start() if self._server is None else self

    def __exit__(self, *_: object) -> None:
        self.stop()


class BadBody(ValueError):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    owner: ConsumerHTTPServer
    server_version = "hubshift"
    sys_version = ""
    timeout = IDLE_TIMEOUT_SECONDS  # the socket's timeout: an idle or trickling client is dropped

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            body, content_type = self.owner.metrics.render(self.headers.get("Accept"))
            self._send(HTTPStatus.OK, body, content_type)
        elif path == LIVENESS_PATH:
            self._probe(self.owner.live, "alive", "not alive")
        elif path == READINESS_PATH:
            self._probe(self.owner.ready, "ready", "not ready")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != ASSIGNMENT_PATH:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n")
            return
        if self.owner.on_assignment is None:
            self._send(HTTPStatus.NOT_IMPLEMENTED, b"this consumer takes no nudges\n")
            return
        try:
            generation = self._generation()
        except BadBody as exc:
            self.close_connection = True  # what the client may still send is not read
            self._send(exc.status, f"{exc}\n".encode())
            return
        try:
            self.owner.on_assignment(generation)
        except Exception:
            log.exception("the assignment nudge failed")
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"nudge failed\n")
            return
        self.owner.metrics.nudges.inc()
        self._send(HTTPStatus.ACCEPTED, b'{"accepted":true}\n', "application/json")

    def _generation(self) -> int | None:
        if self.headers.get("Transfer-Encoding"):
            raise BadBody(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not chunked")
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not declared.isdigit():  # "-1" or garbage would read until the client closes
            raise BadBody(HTTPStatus.BAD_REQUEST, "Content-Length must be a non-negative integer")
        length = int(declared)
        if length > MAX_BODY_BYTES:
            raise BadBody(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return None
        try:
            document: Any = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadBody(HTTPStatus.BAD_REQUEST, 'body must be JSON: {"generation": N}') from None
        generation = document.get("generation") if isinstance(document, dict) else None
        if generation is None:
            return None
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise BadBody(HTTPStatus.BAD_REQUEST, "generation must be an integer")
        return generation

    def _probe(self, probe: Probe, good: str, bad: str) -> None:
        try:
            ok = bool(probe())
        except Exception:
            log.exception("a probe failed")
            ok = False
        status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
        self._send(status, f"{good if ok else bad}\n".encode())

    def _send(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)
